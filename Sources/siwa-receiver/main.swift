import Foundation
import ServiceSupport

// siwa-receiver: Apple's notification endpoint. Configuration from flags or SIWA_* variables; see --help.
let environment = ProcessInfo.processInfo.environment
let status = runReceiver(arguments: Array(CommandLine.arguments.dropFirst()), environment: environment)
// Every thread of ours has ended; `_exit` skips the atexit teardown (OpenSSL's cleanup) that raced with
// threads we do not own (FoundationNetworking's libcurl) and crashed after a clean shutdown.
terminateProcess(status: status)
