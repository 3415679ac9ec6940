/// The database schema (the repository's schema.sql), embedded at build time by the EmbedSchema
/// plugin so that binaries such as `siwactl migrate` work without the source tree.
///
/// `sql` is the whole file, re-runnable on an empty or an existing database; `version` is the
/// highest version it records in `siwa.schema_version`.
public enum SiwaSchema {}
