import Foundation
import PackagePlugin

/// Turns the repository's schema.sql into a Swift source file of the target it is applied to, so the
/// schema is compiled into binaries (`siwactl migrate`) while schema.sql stays the single source.
@main
struct EmbedSchema: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let schema = context.package.directoryURL.appendingPathComponent("schema.sql")
        let output = context.pluginWorkDirectoryURL.appendingPathComponent("EmbeddedSchema.swift")
        return [
            .buildCommand(
                displayName: "Embedding schema.sql into \(target.name)",
                executable: try context.tool(named: "embed-schema").url,
                arguments: [schema.path, output.path],
                inputFiles: [schema],
                outputFiles: [output])
        ]
    }
}
