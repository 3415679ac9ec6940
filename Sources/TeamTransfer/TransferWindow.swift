public import Foundation
import ServiceSupport

/// Apple's window: transfer identifiers are exchanged up to 60 days after the transfer (TN3159).
public enum TransferWindow {
    /// The window's length in days.
    public static let days = 60.0

    /// Days left in the window from `date` (negative once over), or nil without a date.
    public static func daysLeft(transferDate: Date?, now: Date = Date()) -> Double? {
        transferDate.map { days - now.timeIntervalSince($0) / 86400 }
    }

    /// "57d 3h left of Apple's 60-day window (ends 2027-01-30 10:00:00Z)", or how long ago it ended.
    public static func describe(transferDate: Date, now: Date = Date()) -> String {
        let end = transferDate.addingTimeInterval(days * 86400)
        let left = end.timeIntervalSince(now)
        return left > 0
            ? "\(formatAge(left)) left of Apple's 60-day window (ends \(formatShort(end)))"
            : "Apple's 60-day window ended \(formatAge(-left)) ago (\(formatShort(end)))"
    }

    /// Refuses a run once the window is over (Apple no longer answers).
    public static func requireOpen(transferDate: Date?, now: Date = Date()) throws {
        if let transferDate, let left = daysLeft(transferDate: transferDate, now: now), left <= 0 {
            throw TeamTransferError(
                "\(describe(transferDate: transferDate, now: now)): Apple no longer exchanges transfer identifiers (see TN3159 for what is left)"
            )
        }
    }

    /// Whether `text` is a team ID: ten upper-case letters and digits.
    public static func isTeamID(_ text: String) -> Bool {
        text.count == 10 && text.allSatisfy { $0.isASCII && ($0.isUppercase || $0.isNumber) }
    }
}
