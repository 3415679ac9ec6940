import Doctor
import Foundation
import ServiceSupport

/// `siwactl doctor URL`: checks a deployed notification endpoint the way Apple will reach it, one
/// verdict per check with its fix. Exit 0 when nothing failed (warnings allowed), 1 on any failure.
enum DoctorVerb {
    static let spec = CommandSpec(
        name: "siwactl doctor",
        abstract: """
            Check a deployed notification endpoint as Apple will reach it: DNS, https with TLS 1.2+ and a
            trusted certificate for the host, POST {} answered 400, a notification signed by a key Apple
            never had answered 401, answer time; with --database-url, that workers are alive and that the
            receivers accept every client ID in use. One line per check (ok, warn, FAIL) with the fix; exit
            status 1 when any check failed.
            """,
        options: [
            CommandOption(
                "audience", valueName: "AUD",
                help: "Client ID for the aud claim of the forged notification (default: siwactl.doctor).",
                environmentVariable: "SIWA_DOCTOR_AUDIENCE"),
            CommandOption(
                "timeout", valueName: "SECONDS", help: "Deadline for each request.",
                environmentVariable: "SIWA_DOCTOR_TIMEOUT", defaultValue: "10"),
            CommandOption(
                "slow-after", valueName: "SECONDS", help: "Warn when an answer takes longer than this.",
                environmentVariable: "SIWA_DOCTOR_SLOW_AFTER", defaultValue: "2"),
            CommandOption(
                "database-url", valueName: "URL",
                help: """
                    Also check the database (as its owner or a siwa_admin member): workers alive, and the \
                    receivers' audiences against the client IDs in use.
                    """,
                environmentVariable: "SIWA_DATABASE_URL"
            ).secret(.connectionString),
            CommandOption(
                "heartbeat-max-age", valueName: "SECONDS",
                help: "A receiver or worker whose last heartbeat is older than this is not alive.",
                environmentVariable: "SIWA_DOCTOR_HEARTBEAT_MAX_AGE", defaultValue: "60"),
        ],
        flags: [
            CommandFlag(
                "allow-http-loopback",
                help: "Check a plain http URL on a loopback host (tests); still reported as a warning.",
                environmentVariable: "SIWA_DOCTOR_ALLOW_HTTP_LOOPBACK")
        ],
        positionals: [
            CommandPositional(
                "URL", help: "The endpoint registered with Apple, e.g. https://host/apple/notifications.")
        ])

    static let verb = Verb(name: "doctor", abstract: "Check a deployed endpoint as Apple will reach it.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            let timeout: Duration
            let slowAfter: Duration
            let heartbeatMaxAge: Duration
            do {
                timeout = try parsed.seconds("timeout", positive: true) ?? .seconds(10)
                slowAfter = try parsed.seconds("slow-after", positive: true) ?? .seconds(2)
                heartbeatMaxAge = try parsed.seconds("heartbeat-max-age", positive: true) ?? .seconds(60)
            } catch let error as CommandLineError {
                writeErrorLine(spec.name, error.message)
                return ExitStatus.usage
            } catch {
                writeErrorLine(spec.name, "\(error)")
                return ExitStatus.usage
            }
            let configuration: Doctor.Configuration
            do {
                configuration = try Doctor.Configuration(
                    url: parsed.positionals[0], allowHTTPLoopback: parsed.flag("allow-http-loopback"),
                    audience: parsed.value("audience") ?? "siwactl.doctor", timeout: timeout,
                    slowAfter: slowAfter, environment: environment)
            } catch {
                writeErrorLine(spec.name, "\(error)")
                return ExitStatus.usage
            }
            var doctor = Doctor(configuration: configuration) { writeStandardOutput($0.text) }
            doctor.checkEndpoint()
            if let databaseURL = parsed.value("database-url"), !databaseURL.isEmpty {
                doctor.checkDatabase(url: databaseURL, heartbeatMaxAge: heartbeatMaxAge)
            }
            writeStandardOutput(doctor.summary)
            return doctor.isHealthy ? ExitStatus.success : ExitStatus.failure
        }
    }
}
