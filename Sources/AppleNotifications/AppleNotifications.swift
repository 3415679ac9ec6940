// Placeholder for the AppleNotifications module.
import COpenSSL
