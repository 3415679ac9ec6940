/// The error `body` threw, when it is a `Failure`; nil when it threw nothing or another error. (A
/// `do`/`catch let error as` of a typed-throws error inside a test crashes Swift 6.3's SIL pass.)
public func thrown<Failure: Error>(_ type: Failure.Type, _ body: () throws -> Void) -> Failure? {
    do {
        try body()
        return nil
    } catch {
        return error as? Failure
    }
}
