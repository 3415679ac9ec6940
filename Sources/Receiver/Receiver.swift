// Placeholder for the Receiver module.
