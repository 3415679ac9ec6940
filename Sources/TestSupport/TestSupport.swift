// Placeholder for the TestSupport module.
