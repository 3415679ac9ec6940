import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A TCP socket bound to 127.0.0.1 on a port the kernel chooses: what test servers listen on, and what
/// ``RefusingPort`` holds.
enum LoopbackSocket {
    /// Binds a new socket (listening with `backlog` when given; with `SO_REUSEPORT` when `reusePort`) and
    /// returns it with its port; the caller owns the descriptor.
    static func bound(listenBacklog backlog: Int32? = nil, reusePort: Bool = false) throws -> (
        fd: Int32, port: Int
    ) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ExecutableError("socket() failed") }
        var on: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(4))
        if reusePort { _ = setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, socklen_t(4)) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa -> Bool in
                bind(fd, sa, length) == 0 && (backlog.map { listen(fd, $0) == 0 } ?? true)
                    && getsockname(fd, sa, &length) == 0
            }
        }
        guard bound else {
            close(fd)
            throw ExecutableError("bind() failed")
        }
        return (fd, Int(UInt16(bigEndian: address.sin_port)))
    }
}
