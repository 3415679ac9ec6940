import Foundation
import ServiceSupport

// siwa-receiver: Apple's notification endpoint. Configuration from flags or SIWA_* variables; see --help.
let environment = ProcessInfo.processInfo.environment
let status = runReceiver(arguments: Array(CommandLine.arguments.dropFirst()), environment: environment)
exit(status)
