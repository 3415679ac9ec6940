/// Whether `given` equals `expected`, in time that depends only on `expected`'s length: for secrets a
/// caller presents (bearer tokens, nonce hashes), compared with the one this process holds.
public func constantTimeEqual(_ given: [UInt8], _ expected: [UInt8]) -> Bool {
    var difference: UInt8 = given.count == expected.count ? 0 : 1
    for index in expected.indices {
        difference |= (index < given.count ? given[index] : ~expected[index]) ^ expected[index]
    }
    return difference == 0
}

/// ``constantTimeEqual(_:_:)`` of the strings' UTF-8.
public func constantTimeEqual(_ given: String, _ expected: String) -> Bool {
    constantTimeEqual(Array(given.utf8), Array(expected.utf8))
}
