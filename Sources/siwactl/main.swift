import Foundation
import ServiceSupport

// siwactl: the operator's tool. One file per verb; this file only dispatches.
// Exit codes: 0 success, 1 failure (e.g. a token that does not verify), 2 usage error.

let verbs: [Verb] = [
    KeygenVerb.verb, SignVerb.verb, VerifyVerb.verb, ClientSecretVerb.verb, MigrateVerb.verb, EventsVerb.verb,
    ReplayVerb.verb, StatsVerb.verb, FakeAppleVerb.verb, SimulateVerb.verb,
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
    text += "\nRun 'siwactl VERB --help' for a verb's options.\n"
    return text
}

let arguments = Array(CommandLine.arguments.dropFirst())
let environment = ProcessInfo.processInfo.environment
let status: Int32
if let first = arguments.first, let verb = verbs.first(where: { $0.name == first }) {
    status = await verb.run(Array(arguments.dropFirst()), environment)
} else if arguments.isEmpty || arguments.first == "--help" || arguments.first == "-h"
    || arguments.first == "help"
{
    writeOut(topLevelHelp())
    status = arguments.isEmpty ? ExitStatus.usage : ExitStatus.success
} else {
    writeError("siwactl: unknown verb '\(arguments[0])' (see siwactl --help)")
    status = ExitStatus.usage
}
// Like the services: no atexit teardown (OpenSSL's cleanup) beside threads we do not own, such as
// FoundationNetworking's in `simulate` or the HTTP server's in `fake-apple`.
terminateProcess(status: status)
