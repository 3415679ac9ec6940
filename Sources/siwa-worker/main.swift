import Foundation
import ServiceSupport

// siwa-worker: applies stored Sign in with Apple notifications. Configuration from flags or SIWA_*
// variables; see --help. Exit codes: 0 done (stopped by SIGTERM/SIGINT, or --once drained), 1 failure,
// 2 usage error.
let status = runWorker(
    arguments: Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
// Every thread of ours has ended (the group joined them); `_exit` skips the atexit teardown that races
// with threads we do not own.
terminateProcess(status: status)
