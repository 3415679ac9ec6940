public import ServiceSupport

/// A logger that discards its output, for code under test that must be given one.
public let quietLogger = Logger(label: "test", level: .error, sink: { _ in })
