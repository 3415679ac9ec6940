/// What this binary is: the product version (the repository's VERSION file), the commit it was built
/// from and the schema version it embeds, all fixed at build time by the EmbedSchema plugin.
///
/// ``commit`` is `SIWA_BUILD_COMMIT` from the build's environment when set (builds from a tarball or
/// in a container have no git checkout), else the checkout's `git rev-parse --short=12 HEAD`, else
/// `unknown`.
public enum SiwaBuild {
    /// The schema version of the embedded schema.sql (``SiwaSchema/version``).
    public static var schemaVersion: Int { SiwaSchema.version }

    /// The line `--version` prints: `siwactl 5.0.0-dev (commit 0123456789ab, schema 5)`.
    public static func versionLine(_ program: String) -> String {
        "\(program) \(version) (commit \(commit), schema \(schemaVersion))"
    }

    /// The labels of `siwa_build_info`: version, commit and schema version.
    public static var metricLabels: [(String, String)] {
        [("version", version), ("commit", commit), ("schema_version", String(schemaVersion))]
    }
}
