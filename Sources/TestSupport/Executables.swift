public import Foundation

/// Finds and runs the package's built executables from tests.
///
/// `swift build` puts them beside the test bundle (`.build/<config>/`); `make test` builds them first.
public enum ExecutableLocator {
    /// The output of a finished process.
    public struct Result: Sendable {
        public var status: Int32
        public var standardOutput: String
        public var standardError: String
    }

    /// The built executable `name`.
    public static func url(named name: String) -> URL {
        for directory in candidateDirectories() {
            let candidate = directory.appendingPathComponent(name)
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
        }
        return RepositoryRoot.url.appendingPathComponent(".build/debug/\(name)")
    }

    private static func candidateDirectories() -> [URL] {
        var directories: [URL] = []
        // The test runner runs from the build directory's bundle (`…/debug/xxxPackageTests.xctest`).
        let bundle = Bundle.main.bundleURL
        directories.append(bundle.deletingLastPathComponent())
        directories.append(bundle)
        if let argument = CommandLine.arguments.first {
            directories.append(URL(fileURLWithPath: argument).deletingLastPathComponent())
        }
        directories.append(RepositoryRoot.url.appendingPathComponent(".build/debug"))
        return directories
    }

    /// Runs `executable` to completion with `input` on standard input.
    public static func run(
        _ executable: URL, arguments: [String], environment: [String: String]? = nil, input: Data? = nil,
        timeout: Duration = .seconds(60)
    ) throws -> Result {
        try Subprocess.run(
            executable.path, arguments, environment: environment, input: input, timeout: timeout)
    }

}

/// Running an executable failed.
public struct ExecutableError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
