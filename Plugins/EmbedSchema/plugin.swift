import Foundation
import PackagePlugin

/// Turns the repository's schema.sql into a Swift source file of the target it is applied to, so the
/// schema is compiled into binaries (`siwactl migrate`) while schema.sql stays the single source. The
/// tool also regenerates schema.sql from its part files in schema/ and fails the build when the
/// committed file differs (run `make schema`), so the parts are inputs too.
@main
struct EmbedSchema: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let schema = context.package.directoryURL.appendingPathComponent("schema.sql")
        let parts = context.package.directoryURL.appendingPathComponent("schema")
        let partFiles =
            ((try? FileManager.default.contentsOfDirectory(atPath: parts.path)) ?? [])
            .filter { $0.hasSuffix(".sql") }.sorted()
            .map { parts.appendingPathComponent($0) }
        let output = context.pluginWorkDirectoryURL.appendingPathComponent("EmbeddedSchema.swift")
        return [
            .buildCommand(
                displayName: "Embedding schema.sql into \(target.name)",
                executable: try context.tool(named: "embed-schema").url,
                arguments: [schema.path, output.path, parts.path],
                inputFiles: [schema] + partFiles,
                outputFiles: [output])
        ]
    }
}
