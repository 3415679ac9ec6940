import Foundation
import ServiceSupport
import SiwaSchema

// siwactl: the operator's tool. One file per verb; this file only dispatches.
// Exit codes: 0 success, 1 failure (e.g. a token that does not verify), 2 usage error.

enum Siwactl {
    static let verbs: [Verb] = [
        KeygenVerb.verb, SignVerb.verb, VerifyVerb.verb, ClientSecretVerb.verb, MigrateVerb.verb,
        EventsVerb.verb, ReplayVerb.verb, StatsVerb.verb, FakeAppleVerb.verb, SimulateVerb.verb,
        DoctorVerb.verb, TransferVerb.verb, WebhooksVerb.verb, MailVerb.verb, SharedSignalsVerb.verb,
        AdaptersVerb.verb,
    ]

    /// `siwactl` itself: its verbs, and `--version`, `--help` and unknown verbs.
    static let root: Verb = Verb(
        name: "siwactl", abstract: "Sign in with Apple notifications: operator's tool.", subverbs: verbs
    ) { arguments, _ in
        if arguments.first == "--version" || arguments.first == "version" {
            writeStandardOutput(SiwaBuild.versionLine("siwactl") + "\n")
            return ExitStatus.success
        }
        if arguments.isEmpty || arguments.first == "--help" || arguments.first == "-h"
            || arguments.first == "help"
        {
            writeStandardOutput(
                root.helpText(path: "siwactl", footnote: "; 'siwactl --version' for the version"))
            return arguments.isEmpty ? ExitStatus.usage : ExitStatus.success
        }
        writeErrorLine("siwactl", "unknown verb '\(arguments[0])' (see siwactl --help)")
        return ExitStatus.usage
    }
}

let status = await Siwactl.root.dispatch(
    Array(CommandLine.arguments.dropFirst()), ProcessInfo.processInfo.environment, path: "siwactl")
// As the services end: flush what was written, then `_exit`, skipping the atexit teardown (OpenSSL's
// cleanup) that can race with threads we do not own and that may still run here (FoundationNetworking's
// libcurl after `simulate`, the HTTP server's after `fake-apple`).
terminateProcess(status: status)
