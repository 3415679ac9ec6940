import Foundation
import ServiceSupport
import SiwaSchema

// siwactl: the operator's tool. One file per verb; this file only dispatches.
// Exit codes: 0 success, 1 failure (e.g. a token that does not verify), 2 usage error.

let verbs: [Verb] = [
    KeygenVerb.verb, SignVerb.verb, VerifyVerb.verb, ClientSecretVerb.verb, MigrateVerb.verb, EventsVerb.verb,
    ReplayVerb.verb, StatsVerb.verb, FakeAppleVerb.verb, SimulateVerb.verb, DoctorVerb.verb,
    TransferVerb.verb,
    WebhooksVerb.verb,
]

func topLevelHelp() -> String {
    var text =
        "usage: siwactl VERB [OPTIONS]\n\nSign in with Apple notifications: operator's tool.\n\nverbs:\n"
    let width = verbs.map(\.name.count).max() ?? 0
    for verb in verbs {
        text +=
            "  \(verb.name)" + String(repeating: " ", count: width - verb.name.count + 2) + verb.abstract
            + "\n"
    }
    text += "\nRun 'siwactl VERB --help' for a verb's options; 'siwactl --version' for the version.\n"
    return text
}

let arguments = Array(CommandLine.arguments.dropFirst())
let environment = ProcessInfo.processInfo.environment
let status: Int32
if let first = arguments.first, let verb = verbs.first(where: { $0.name == first }) {
    status = await verb.run(Array(arguments.dropFirst()), environment)
} else if arguments.first == "--version" || arguments.first == "version" {
    writeStandardOutput(SiwaBuild.versionLine("siwactl") + "\n")
    status = ExitStatus.success
} else if arguments.isEmpty || arguments.first == "--help" || arguments.first == "-h"
    || arguments.first == "help"
{
    writeStandardOutput(topLevelHelp())
    status = arguments.isEmpty ? ExitStatus.usage : ExitStatus.success
} else {
    writeErrorLine("siwactl", "unknown verb '\(arguments[0])' (see siwactl --help)")
    status = ExitStatus.usage
}
// As the services end: flush what was written, then `_exit`, skipping the atexit teardown (OpenSSL's
// cleanup) that can race with threads we do not own and that may still run here (FoundationNetworking's
// libcurl after `simulate`, the HTTP server's after `fake-apple`).
terminateProcess(status: status)
