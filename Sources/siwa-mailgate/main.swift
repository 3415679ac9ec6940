import Foundation
import ServiceSupport

// siwa-mailgate: the relay-mail gate for Postfix and the app's mail code. Flags or SIWA_MAILGATE_*; see --help.
let status = runMailGate(
    arguments: Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
terminateProcess(status: status)
