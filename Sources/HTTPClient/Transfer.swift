import CCurl
import CCurlShim
import Foundation

/// A libcurl easy handle kept between transfers (``OutboundHTTP/Session``): libcurl keeps the
/// connections it opened, its TLS session IDs and its DNS cache in the handle, so the next transfer to
/// the same origin reuses them. Every transfer starts from a handle reset to no options at all
/// (`curl_easy_reset`, which keeps those caches) and configured afresh, as a new handle would be. Used
/// by one transfer at a time.
final class ReusableHandle {
    /// Made by the first transfer that uses it (after libcurl's global initialisation).
    fileprivate var handle: UnsafeMutableRawPointer?

    init() {}

    deinit {
        if let handle { curl_easy_cleanup(handle) }  // closes the connections it kept
    }
}

/// One request on one libcurl easy handle: the policy turned into options, the callbacks that hold
/// the caps, and libcurl's result turned into an ``OutboundHTTP/Error``. Used on one thread only.
final class Transfer {
    typealias Failure = OutboundHTTP.Error

    private let request: OutboundHTTP.Request
    private let policy: OutboundHTTP.Policy
    private let environment: [String: String]
    private let reusable: ReusableHandle?
    private var handle: UnsafeMutableRawPointer?
    /// The connections libcurl opened for this transfer (0 when it reused one), once it ran.
    private(set) var connectionsOpened = 0
    private var body: [UInt8] = []
    private var headerBytes = 0
    private var headChecked = false
    /// Why a callback ended the transfer (libcurl then reports only CURLE_WRITE_ERROR).
    private var refusal: Failure?

    /// Header names the transport owns: the caller may not set them.
    private static let reservedHeaders: Set<String> = [
        "host", "content-length", "transfer-encoding", "accept-encoding", "expect", "connection", "te",
        "upgrade", "proxy-connection",
    ]

    /// A transfer on a handle of its own (closed with its connection at the end), or on `reusable`'s.
    init(
        request: OutboundHTTP.Request, policy: OutboundHTTP.Policy, environment: [String: String],
        reusing reusable: ReusableHandle? = nil
    ) {
        self.request = request
        self.policy = policy
        self.environment = environment
        self.reusable = reusable
    }

    func run() throws(Failure) -> OutboundHTTP.Response {
        try checkRequest()
        guard siwa_curl_global_init_once() == CURLE_OK else {
            throw Failure(.internal, "libcurl could not be initialised")
        }
        let (scheme, host, url) = try parseURL()
        defer { curl_url_cleanup(url) }
        guard
            scheme == "https"
                || (scheme == "http" && policy.allowsPlainHTTPToLoopback
                    && OutboundHTTP.isLoopback(host: host))
        else {
            throw Failure(
                .policy,
                policy.allowsPlainHTTPToLoopback
                    ? "URL must use https (http only for 127.0.0.0/8, ::1 or localhost)"
                    : "URL must use https")
        }
        var headerList: UnsafeMutablePointer<curl_slist>?
        defer { curl_slist_free_all(headerList) }
        for line in request.headers.map({ "\($0.name): \($0.value)" }) + [
            "Accept-Encoding: identity", "Expect:",
        ] {
            guard let extended = curl_slist_append(headerList, line) else {
                throw Failure(.internal, "out of memory for the request headers")
            }
            headerList = extended
        }
        if let reusable, reusable.handle == nil { reusable.handle = curl_easy_init() }
        guard let handle = reusable?.handle ?? curl_easy_init() else {
            throw Failure(.internal, "libcurl could not make a handle")
        }
        self.handle = handle
        // Runs first: the handle goes (or forgets every option: a kept handle keeps only its
        // connections and caches) before the header list and the URL it points to.
        defer {
            if reusable == nil { curl_easy_cleanup(handle) } else { curl_easy_reset(handle) }
            self.handle = nil
        }
        try configure(handle, url: url, scheme: scheme, host: host, headers: headerList)

        let code = curl_easy_perform(handle)
        var opened = 0
        _ = siwa_curl_getinfo_long(handle, CURLINFO_NUM_CONNECTS, &opened)
        connectionsOpened = opened
        if let refusal { throw refusal }
        guard code == CURLE_OK else { throw failure(for: code) }
        var status = 0
        _ = siwa_curl_getinfo_long(handle, CURLINFO_RESPONSE_CODE, &status)
        let headers = responseHeaders()
        let response = OutboundHTTP.Response(status: status, headers: headers, body: body)
        // A body-less answer never reached the write callback: check its head here.
        if !headChecked, policy.refusesContentEncoding,
            let refusal = encodingRefusal(response.value(of: "Content-Encoding"))
        {
            throw refusal
        }
        return response
    }

    // MARK: - Checks before anything is sent

    private func checkRequest() throws(Failure) {
        guard policy.timeout > .zero, policy.maxResponseBodyBytes > 0, policy.maxHeaderBytes > 0 else {
            throw Failure(.policy, "the policy's limits must be positive")
        }
        guard !request.method.isEmpty, request.method.count <= 16,
            request.method.utf8.allSatisfy({ $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") })
        else { throw Failure(.policy, "invalid method") }
        for header in request.headers {
            guard !header.name.isEmpty, header.name.utf8.allSatisfy(Self.isTokenByte) else {
                throw Failure(.policy, "invalid header name")
            }
            guard !Self.reservedHeaders.contains(header.name.lowercased()) else {
                throw Failure(.policy, "header \(header.name) is set by the transport")
            }
            guard !header.value.utf8.contains(where: { $0 == 13 || $0 == 10 || $0 == 0 }) else {
                throw Failure(.policy, "invalid value for header \(header.name)")
            }
        }
    }

    /// RFC 9110 `tchar`.
    private static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default: return Array("!#$%&'*+-.^_`|~".utf8).contains(byte)
        }
    }

    /// libcurl's parse of the URL: the same parse decides the policy and the connection.
    private func parseURL() throws(Failure) -> (scheme: String, host: String, url: OpaquePointer) {
        guard let url = curl_url() else { throw Failure(.internal, "libcurl could not make a URL handle") }
        func part(_ which: CURLUPart) -> String? {
            var text: UnsafeMutablePointer<CChar>?
            guard curl_url_get(url, which, &text, 0) == CURLUE_OK, let text else { return nil }
            defer { curl_free(text) }
            return String(cString: text)
        }
        guard !request.url.utf8.contains(where: { $0 <= 32 || $0 == 127 }),
            curl_url_set(url, CURLUPART_URL, request.url, 0) == CURLUE_OK,
            let scheme = part(CURLUPART_SCHEME)?.lowercased(), let host = part(CURLUPART_HOST), !host.isEmpty
        else {
            curl_url_cleanup(url)
            throw Failure(.policy, "invalid URL (absolute http or https URL expected)")
        }
        return (scheme, host, url)
    }

    // MARK: - Options

    private func configure(
        _ handle: UnsafeMutableRawPointer, url: OpaquePointer, scheme: String, host: String,
        headers: UnsafeMutablePointer<curl_slist>?
    ) throws(Failure) {
        let milliseconds = max(
            1,
            Int(policy.timeout.components.seconds) * 1000
                + Int(policy.timeout.components.attoseconds / 1_000_000_000_000_000))
        let context = Unmanaged.passUnretained(self).toOpaque()
        let proxy = try proxySettings(scheme: scheme, host: host)
        let caFile = policy.caFile ?? environment["SSL_CERT_FILE"].flatMap { $0.isEmpty ? nil : $0 }

        var results: [CURLcode] = [
            siwa_curl_setopt_curlu(handle, CURLOPT_CURLU, url),
            siwa_curl_setopt_string(handle, CURLOPT_PROTOCOLS_STR, "http,https"),
            siwa_curl_setopt_string(handle, CURLOPT_REDIR_PROTOCOLS_STR, "http,https"),
            siwa_curl_setopt_long(handle, CURLOPT_FOLLOWLOCATION, 0),
            siwa_curl_setopt_long(handle, CURLOPT_MAXREDIRS, 0),
            siwa_curl_setopt_long(handle, CURLOPT_NOSIGNAL, 1),
            siwa_curl_setopt_long(handle, CURLOPT_TIMEOUT_MS, milliseconds),
            siwa_curl_setopt_long(handle, CURLOPT_CONNECTTIMEOUT_MS, milliseconds),
            siwa_curl_setopt_off_t(
                handle, CURLOPT_MAXFILESIZE_LARGE, curl_off_t(policy.maxResponseBodyBytes)),
            siwa_curl_setopt_long(handle, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1),
            siwa_curl_setopt_long(handle, CURLOPT_SSLVERSION, CURL_SSLVERSION_TLSv1_2),
            siwa_curl_setopt_long(handle, CURLOPT_PROXY_SSLVERSION, CURL_SSLVERSION_TLSv1_2),
            siwa_curl_setopt_long(handle, CURLOPT_SSL_VERIFYPEER, 1),
            siwa_curl_setopt_long(handle, CURLOPT_SSL_VERIFYHOST, 2),
            siwa_curl_setopt_long(handle, CURLOPT_PROXY_SSL_VERIFYPEER, 1),
            siwa_curl_setopt_long(handle, CURLOPT_PROXY_SSL_VERIFYHOST, 2),
            siwa_curl_setopt_string(handle, CURLOPT_USERAGENT, policy.userAgent),
            siwa_curl_setopt_slist(handle, CURLOPT_HTTPHEADER, headers),
            siwa_curl_setopt_long(handle, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1),
            siwa_curl_setopt_string(handle, CURLOPT_PROXY, proxy.proxy),
            siwa_curl_setopt_string(handle, CURLOPT_NOPROXY, proxy.noProxy),
            siwa_curl_setopt_data_function(handle, CURLOPT_WRITEFUNCTION, Self.writeCallback),
            siwa_curl_setopt_pointer(handle, CURLOPT_WRITEDATA, context),
            siwa_curl_setopt_data_function(handle, CURLOPT_HEADERFUNCTION, Self.headerCallback),
            siwa_curl_setopt_pointer(handle, CURLOPT_HEADERDATA, context),
        ]
        if let caFile {
            results.append(siwa_curl_setopt_string(handle, CURLOPT_CAINFO, caFile))
            results.append(siwa_curl_setopt_string(handle, CURLOPT_PROXY_CAINFO, caFile))
        }
        switch (request.method, request.body) {
        case ("GET", nil):
            results.append(siwa_curl_setopt_long(handle, CURLOPT_HTTPGET, 1))
        case ("HEAD", nil):
            results.append(siwa_curl_setopt_long(handle, CURLOPT_NOBODY, 1))
        case (let method, nil) where method != "POST":
            results.append(siwa_curl_setopt_string(handle, CURLOPT_CUSTOMREQUEST, method))
        case (let method, let body):
            let bytes = body ?? []
            results.append(
                siwa_curl_setopt_off_t(handle, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(bytes.count)))
            // Copied by libcurl during the call, so the buffer need not outlive it.
            results.append(
                bytes.isEmpty
                    ? siwa_curl_setopt_string(handle, CURLOPT_COPYPOSTFIELDS, "")
                    : bytes.withUnsafeBytes {
                        siwa_curl_setopt_pointer(
                            handle, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: $0.baseAddress))
                    })
            if method != "POST" {
                results.append(siwa_curl_setopt_string(handle, CURLOPT_CUSTOMREQUEST, method))
            }
        }
        if let failed = results.first(where: { $0 != CURLE_OK }) {
            throw Failure(
                .internal, "libcurl refused an option (\(Self.text(failed)))", curlCode: Int(failed.rawValue))
        }
    }

    /// The proxy for this request: `https_proxy`/`HTTPS_PROXY` for an `https` URL unless the host is
    /// loopback or proxies are not to be used; `""` (no proxy, whatever the environment says)
    /// otherwise. `no_proxy` is honoured, and loopback is always in it.
    private func proxySettings(scheme: String, host: String) throws(Failure) -> (
        proxy: String, noProxy: String
    ) {
        let loopback = "localhost,127.0.0.0/8,::1"
        let noProxy =
            (environment["no_proxy"] ?? environment["NO_PROXY"]).map {
                $0.isEmpty ? loopback : "\($0),\(loopback)"
            } ?? loopback
        guard policy.usesProxyFromEnvironment, scheme == "https", !OutboundHTTP.isLoopback(host: host),
            let proxy = environment["https_proxy"] ?? environment["HTTPS_PROXY"], !proxy.isEmpty
        else { return ("", noProxy) }
        if let separator = proxy.range(of: "://") {
            let proxyScheme = proxy[..<separator.lowerBound].lowercased()
            guard proxyScheme == "http" || proxyScheme == "https" else {
                throw Failure(.proxy, "https_proxy must be an http or https proxy URL")
            }
        }
        return (proxy, noProxy)
    }

    // MARK: - Callbacks

    private static let writeCallback: siwa_curl_data_fn = { data, size, count, context in
        let transfer = Unmanaged<Transfer>.fromOpaque(context!).takeUnretainedValue()
        return transfer.receiveBody(data, size * count)
    }

    private static let headerCallback: siwa_curl_data_fn = { data, size, count, context in
        let transfer = Unmanaged<Transfer>.fromOpaque(context!).takeUnretainedValue()
        return transfer.receiveHeader(data, size * count)
    }

    /// Appends body bytes unless they pass the cap; returning anything but `length` ends the transfer.
    private func receiveBody(_ data: UnsafeMutablePointer<CChar>?, _ length: Int) -> Int {
        if !headChecked, !checkHead() { return 0 }
        guard length <= policy.maxResponseBodyBytes - body.count else {
            refusal = Failure(.tooLarge, "answer larger than \(policy.maxResponseBodyBytes) bytes")
            return 0
        }
        if let data, length > 0 {
            data.withMemoryRebound(to: UInt8.self, capacity: length) {
                body.append(contentsOf: UnsafeBufferPointer(start: $0, count: length))
            }
        }
        return length
    }

    /// Counts header bytes against the cap, and checks the head once the final response's is in.
    private func receiveHeader(_ data: UnsafeMutablePointer<CChar>?, _ length: Int) -> Int {
        headerBytes += length
        guard headerBytes <= policy.maxHeaderBytes else {
            refusal = Failure(.tooLarge, "answer headers larger than \(policy.maxHeaderBytes) bytes")
            return 0
        }
        // The empty line ends a head; a 1xx head is followed by another.
        if length <= 2, let data, data[0] == 13 || data[0] == 10 {
            var status = 0
            if let handle { _ = siwa_curl_getinfo_long(handle, CURLINFO_RESPONSE_CODE, &status) }
            if status >= 200, !checkHead() { return 0 }
        }
        return length
    }

    /// Applies the policy to the final response's head; false (and ``refusal`` set) to refuse it.
    private func checkHead() -> Bool {
        headChecked = true
        guard policy.refusesContentEncoding, let handle else { return true }
        var field: UnsafeMutablePointer<curl_header>?
        var encoding: String?
        if curl_easy_header(handle, "Content-Encoding", 0, siwa_curlh_header(), -1, &field) == CURLHE_OK,
            let value = field?.pointee.value
        {
            encoding = String(cString: value)
        }
        if let failure = encodingRefusal(encoding) {
            refusal = failure
            return false
        }
        return true
    }

    private func encodingRefusal(_ encoding: String?) -> Failure? {
        guard policy.refusesContentEncoding, let encoding,
            encoding.trimmingCharacters(in: .whitespaces).lowercased() != "identity"
        else { return nil }
        return Failure(.contentEncoding, "refused a compressed answer (Content-Encoding)")
    }

    // MARK: - Results

    /// The final response's header fields, as libcurl parsed them.
    private func responseHeaders() -> [OutboundHTTP.Header] {
        guard let handle else { return [] }
        var headers: [OutboundHTTP.Header] = []
        var previous: UnsafeMutablePointer<curl_header>?
        while let field = curl_easy_nextheader(handle, siwa_curlh_header(), -1, previous) {
            if let name = field.pointee.name, let value = field.pointee.value {
                headers.append(OutboundHTTP.Header(String(cString: name), String(cString: value)))
            }
            previous = field
        }
        return headers
    }

    private static func text(_ code: CURLcode) -> String {
        curl_easy_strerror(code).map { String(cString: $0) } ?? "error \(code.rawValue)"
    }

    /// libcurl's result as an error whose text holds no URL, header value or body.
    private func failure(for code: CURLcode) -> Failure {
        let library = "libcurl: \(Self.text(code))"
        var proxyStatus = 0
        if let handle { _ = siwa_curl_getinfo_long(handle, CURLINFO_HTTP_CONNECTCODE, &proxyStatus) }
        if proxyStatus != 0, !(200..<300).contains(proxyStatus) {
            return Failure(
                .proxy, "the proxy refused the tunnel (HTTP status \(proxyStatus)) (\(library))",
                curlCode: Int(code.rawValue))
        }
        let kind: (OutboundHTTP.Error.Code, String)
        var verifyResult: Int?
        switch code {
        case CURLE_OPERATION_TIMEDOUT:
            kind = (.timeout, "timed out")
        case CURLE_FILESIZE_EXCEEDED:
            kind = (.tooLarge, "answer larger than \(policy.maxResponseBodyBytes) bytes (Content-Length)")
        case CURLE_COULDNT_RESOLVE_HOST:
            kind = (.resolve, "cannot resolve the host")
        case CURLE_COULDNT_RESOLVE_PROXY, CURLE_PROXY:
            kind = (.proxy, "cannot use the proxy")
        case CURLE_COULDNT_CONNECT:
            kind = (.connect, "cannot connect")
        case CURLE_PEER_FAILED_VERIFICATION:
            var result = 0
            if let handle { _ = siwa_curl_getinfo_long(handle, CURLINFO_SSL_VERIFYRESULT, &result) }
            kind = (.tls, "TLS certificate not trusted or not issued for the host (verify result \(result))")
            verifyResult = result
        case CURLE_SSL_CONNECT_ERROR, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER, CURLE_SSL_CACERT_BADFILE,
            CURLE_SSL_ENGINE_NOTFOUND, CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_ENGINE_INITFAILED,
            CURLE_SSL_SHUTDOWN_FAILED, CURLE_SSL_CRL_BADFILE, CURLE_SSL_ISSUER_ERROR,
            CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS, CURLE_USE_SSL_FAILED:
            kind = (.tls, "TLS failed")
        case CURLE_WEIRD_SERVER_REPLY, CURLE_BAD_CONTENT_ENCODING, CURLE_HTTP2, CURLE_HTTP2_STREAM,
            CURLE_RANGE_ERROR:
            kind = (.malformed, "malformed answer")
        case CURLE_UNSUPPORTED_PROTOCOL, CURLE_URL_MALFORMAT, CURLE_LOGIN_DENIED:
            kind = (.policy, "request refused by the transport")
        case CURLE_RECV_ERROR, CURLE_SEND_ERROR, CURLE_GOT_NOTHING, CURLE_PARTIAL_FILE, CURLE_WRITE_ERROR,
            CURLE_READ_ERROR, CURLE_ABORTED_BY_CALLBACK:
            kind = (.transfer, "connection failed or answer cut short")
        default:
            kind = (.internal, "transfer failed")
        }
        return Failure(
            kind.0, "\(kind.1) (\(library))", curlCode: Int(code.rawValue),
            certificateVerifyResult: verifyResult)
    }
}
