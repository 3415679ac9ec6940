// Placeholder for the Worker module.
