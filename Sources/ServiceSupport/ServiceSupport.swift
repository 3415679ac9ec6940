// Placeholder for the ServiceSupport module.
