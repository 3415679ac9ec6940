/* Test tooling for scripts/test-dates: preloaded after libfaketime, hands the process's argv to the Swift
 * runtime again (with libfaketime 0.9.10 preloaded, Swift's CommandLine.arguments comes out empty). */
extern void _swift_stdlib_overrideUnsafeArgvArgc(char **argv, int argc) __attribute__((weak));

static void keep_argv(int argc, char **argv, char **envp) {
    (void)envp;
    if (_swift_stdlib_overrideUnsafeArgvArgc) _swift_stdlib_overrideUnsafeArgvArgc(argv, argc);
}

__attribute__((section(".init_array"), used)) static void (*keep_argv_entry)(int, char **, char **) = keep_argv;
