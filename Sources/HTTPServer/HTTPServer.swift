// Placeholder for the HTTPServer module.
import CHTTPShim
