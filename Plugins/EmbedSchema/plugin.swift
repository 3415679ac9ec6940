import Foundation
import PackagePlugin

/// Turns the repository's schema.sql into a Swift source file of the target it is applied to, so the
/// schema is compiled into binaries (`siwactl migrate`) while schema.sql stays the single source. The
/// tool also regenerates schema.sql from its part files in schema/ and fails the build when the
/// committed file differs (run `make schema`), so the parts are inputs too. A second command embeds
/// the repository's VERSION file with the commit it is built from, so that every binary can say what
/// it is (`--version`, `siwa_build_info`, heartbeats).
///
/// The commit is `SIWA_BUILD_COMMIT` when set in the build's environment (a tarball or image build has
/// no `.git`), else `git rev-parse HEAD` of the package directory, else `unknown`. The build command's
/// inputs include the git files naming the current commit, so a new commit re-embeds it.
@main
struct EmbedSchema: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let package = context.package.directoryURL
        let schema = package.appendingPathComponent("schema.sql")
        let parts = package.appendingPathComponent("schema")
        let partFiles =
            ((try? FileManager.default.contentsOfDirectory(atPath: parts.path)) ?? [])
            .filter { $0.hasSuffix(".sql") }.sorted()
            .map { parts.appendingPathComponent($0) }
        let version = package.appendingPathComponent("VERSION")
        let output = context.pluginWorkDirectoryURL.appendingPathComponent("EmbeddedSchema.swift")
        let buildOutput = context.pluginWorkDirectoryURL.appendingPathComponent("EmbeddedBuild.swift")
        let tool = try context.tool(named: "embed-schema").url
        var buildArguments = ["--build", version.path, package.path, buildOutput.path]
        let override = ProcessInfo.processInfo.environment["SIWA_BUILD_COMMIT"] ?? ""
        if !override.isEmpty { buildArguments.append(override) }
        return [
            .buildCommand(
                displayName: "Embedding schema.sql into \(target.name)",
                executable: tool,
                arguments: [schema.path, output.path, parts.path],
                inputFiles: [schema] + partFiles,
                outputFiles: [output]),
            .buildCommand(
                displayName: "Embedding VERSION and the commit into \(target.name)",
                executable: tool,
                arguments: buildArguments,
                environment: override.isEmpty ? [:] : ["SIWA_BUILD_COMMIT": override],
                inputFiles: [version] + gitHeadFiles(package),
                outputFiles: [buildOutput]),
        ]
    }

    /// The files whose change means another commit is checked out: `HEAD` of the git directory (a
    /// worktree's `.git` file names its own) and the branch ref it points to, plus `packed-refs`.
    private func gitHeadFiles(_ package: URL) -> [URL] {
        let manager = FileManager.default
        let dotGit = package.appendingPathComponent(".git")
        var gitDirectory = dotGit
        var isDirectory: ObjCBool = false
        guard manager.fileExists(atPath: dotGit.path, isDirectory: &isDirectory) else { return [] }
        if !isDirectory.boolValue {
            guard let text = try? String(contentsOf: dotGit, encoding: .utf8),
                let line = text.split(separator: "\n").first(where: { $0.hasPrefix("gitdir: ") })
            else { return [] }
            let path = String(line.dropFirst("gitdir: ".count)).trimmingCharacters(in: .whitespaces)
            gitDirectory =
                path.hasPrefix("/") ? URL(fileURLWithPath: path) : package.appendingPathComponent(path)
        }
        // A worktree's refs live in the common directory.
        var common = gitDirectory
        if let text = try? String(
            contentsOf: gitDirectory.appendingPathComponent("commondir"), encoding: .utf8)
        {
            let path = text.trimmingCharacters(in: .whitespacesAndNewlines)
            common =
                path.hasPrefix("/")
                ? URL(fileURLWithPath: path) : gitDirectory.appendingPathComponent(path).standardizedFileURL
        }
        let head = gitDirectory.appendingPathComponent("HEAD")
        var files = [head]
        if let text = try? String(contentsOf: head, encoding: .utf8), text.hasPrefix("ref: ") {
            let ref = text.dropFirst("ref: ".count).trimmingCharacters(in: .whitespacesAndNewlines)
            let refFile = common.appendingPathComponent(ref)
            if manager.fileExists(atPath: refFile.path) { files.append(refFile) }
        }
        let packed = common.appendingPathComponent("packed-refs")
        if manager.fileExists(atPath: packed.path) { files.append(packed) }
        return files
    }
}
