import AppleID
import Foundation
import ServiceSupport

/// `siwactl client-secret`: the ES256 `client_secret` for Apple's token endpoint, and a health check
/// of an existing one (an expired secret is the most common production outage).
enum ClientSecretVerb {
    /// `expired 1.0 days ago` or `in 30.0 days`: days to an expiry, never a negative count.
    static func relative(days: Double) -> String {
        days < 0
            ? "expired \(String(format: "%.1f", -days)) days ago" : "in \(String(format: "%.1f", days)) days"
    }

    static let makeSpec = CommandSpec(
        name: "siwactl client-secret",
        abstract: """
            Print the client_secret JWT for Apple's token and revoke endpoints, signed (ES256) with the
            P-256 key of your AuthKey_KEYID.p8. It expires after --days (Apple allows at most about 6
            months). Check one later with 'siwactl client-secret check TOKEN', and the key
            with 'siwactl client-secret check-key'.
            """,
        options: [
            AppleCredentialOptions.teamID.requiring(), AppleCredentialOptions.keyID.requiring(),
            CommandOption(
                "client-id", valueName: "C", help: "The client ID: bundle ID or Services ID (sub).",
                isRequired: true),
            AppleCredentialOptions.keyFile.requiring().aliased("key"),
            CommandOption(
                "days", valueName: "N", help: "Lifetime in days, 1 to 180.", defaultValue: "180"),
        ])

    static let checkSpec = CommandSpec(
        name: "siwactl client-secret check",
        abstract: """
            Print how many days a client_secret has left and its header and claims (never the signature).
            Exit status 1 when it has expired, expires within --min-days, or is not what Apple accepts;
            with --key, also when its signature does not match the key.
            """,
        options: [
            CommandOption(
                "min-days", valueName: "N", help: "Fail when fewer than N days remain.", defaultValue: "30"),
            CommandOption(
                "key", valueName: "P8", help: "Also verify the signature with this key's public half."),
        ],
        positionals: [CommandPositional("TOKEN", help: "The client_secret, or '-' to read it from stdin.")])

    static let checkKeySpec = CommandSpec(
        name: "siwactl client-secret check-key",
        abstract: """
            Check the .p8 key the service signs client secrets with: readable by its owner only, an
            unencrypted P-256 private key, a well-formed key ID (ten upper-case letters or digits, as in
            AuthKey_KEYID.p8) and team ID, and, with --public-key, the public half Apple (or fake-apple)
            holds. Prints one verdict line per check (ok, warn, FAIL; never key material). Exit status 0
            when nothing failed, 1 when a check failed, 2 on a usage error.
            """,
        options: [
            AppleCredentialOptions.keyFile.requiring().aliased("key"), AppleCredentialOptions.keyID,
            AppleCredentialOptions.teamID,
            CommandOption(
                "public-key", valueName: "PEM", help: "The public key the key must match (PUBLIC KEY PEM)."),
        ])

    static let verb = Verb(
        name: "client-secret", abstract: "Make or check the client_secret for Apple's token API.",
        subverbs: [
            Verb(name: "check-key", abstract: Verb.firstSentence(checkKeySpec.abstract)) {
                arguments, environment in
                switch parse(checkKeySpec, arguments, environment) {
                case .failure(let exit): return exit.status
                case .success(let parsed):
                    return checkKey(parsed) ? ExitStatus.success : ExitStatus.failure
                }
            },
            Verb(name: "check", abstract: Verb.firstSentence(checkSpec.abstract)) { arguments, environment in
                switch parse(checkSpec, arguments, environment) {
                case .failure(let exit): return exit.status
                case .success(let parsed):
                    guard let minimumDays = Double(parsed.value("min-days") ?? ""), minimumDays >= 0,
                        minimumDays.isFinite
                    else {
                        writeErrorLine(checkSpec.name, "--min-days must be a number of days, 0 or more")
                        return ExitStatus.usage
                    }
                    return await runReportingFailure(checkSpec.name) {
                        try check(parsed, minimumDays: minimumDays)
                    }
                }
            },
        ]
    ) { arguments, environment in
        switch parse(makeSpec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            guard let days = Int(parsed.value("days") ?? ""), (1...180).contains(days) else {
                writeErrorLine(
                    makeSpec.name, "--days must be a whole number from 1 to 180 (Apple's limit is 15777000 s)"
                )
                return ExitStatus.usage
            }
            return await runReportingFailure(makeSpec.name) { try make(parsed, days: days) }
        }
    }

    static func make(_ parsed: ParsedCommand, days: Int) throws {
        let signer = try ClientSecretSigner(
            privateKeyPEM: try readSecretText(
                path: parsed.value(AppleCredentialOptions.keyFile.name)!,
                setting: "--\(AppleCredentialOptions.keyFile.name)"))
        let now = Date()
        let token = try signer.sign(
            teamID: parsed.value(AppleCredentialOptions.teamID.name)!,
            keyID: parsed.value(AppleCredentialOptions.keyID.name)!,
            clientID: parsed.value("client-id")!,
            issuedAt: now, lifetime: TimeInterval(days) * 86400)
        writeStandardOutput(token + "\n")
        writeStandardError(
            "expires \(VerifyVerb.formatISO8601(now.addingTimeInterval(TimeInterval(days) * 86400))) (in \(days) days)\n"
        )
    }

    static func check(_ parsed: ParsedCommand, minimumDays: Double) throws {
        var token = parsed.positionals[0]
        if token == "-" {
            token = String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self)
        }
        token = token.trimmingCharacters(in: .whitespacesAndNewlines)
        let claims = try ClientSecretClaims(decoding: token)
        let now = Date()
        let days = claims.remaining(now: now) / 86400
        var problems: [String] = []
        writeStandardOutput(
            """
            expires: \(VerifyVerb.formatISO8601(claims.expiresAt)) (\(Self.relative(days: days)))
            alg: \(claims.algorithm)
            kid: \(claims.keyID)
            iss (team ID): \(claims.teamID)
            sub (client ID): \(claims.clientID)
            aud: \(claims.audience)
            iat: \(VerifyVerb.formatISO8601(claims.issuedAt))

            """)
        if days < 0 {
            problems.append("it has expired")
        } else if days < minimumDays {
            problems.append(
                "it expires in \(String(format: "%.1f", days)) days, fewer than \(String(format: "%g", minimumDays))"
            )
        }
        if claims.algorithm != "ES256" { problems.append("alg is not ES256") }
        if claims.audience != ClientSecretSigner.audience {
            problems.append("aud is not \(ClientSecretSigner.audience)")
        }
        if claims.expiresAt.timeIntervalSince(claims.issuedAt) > ClientSecretSigner.maximumLifetime {
            problems.append("exp - iat exceeds Apple's limit of \(Int(ClientSecretSigner.maximumLifetime)) s")
        }
        if let keyPath = parsed.value("key") {
            let signer = try ClientSecretSigner(
                privateKeyPEM: try readSecretText(path: keyPath, setting: "--key"))
            if signer.verifySignature(of: token) {
                writeStandardOutput("signature: valid for \(keyPath)\n")
            } else {
                writeStandardOutput("signature: INVALID for \(keyPath)\n")
                problems.append("the signature does not match \(keyPath)")
            }
        }
        if !problems.isEmpty { throw ToolFailure(problems.joined(separator: "; ")) }
    }

    /// Runs the .p8 checks, printing a verdict per check; true when none failed.
    static func checkKey(_ parsed: ParsedCommand) -> Bool {
        let path = parsed.value(AppleCredentialOptions.keyFile.name)!
        var failures = 0
        func verdict(_ level: String, _ text: String) {
            if level == "FAIL" { failures += 1 }
            writeStandardOutput("\(level): \(text)\n")
        }
        defer {
            writeStandardOutput(
                failures == 0
                    ? "verdict: ok\n"
                    : "verdict: FAIL (\(failures) check\(failures == 1 ? "" : "s") failed)\n")
        }
        var info = stat()
        guard stat(path, &info) == 0 else {
            verdict("FAIL", "cannot stat \(path) (\(String(cString: strerror(errno))))")
            return false
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            verdict("FAIL", "\(path) is not a regular file")
            return false
        }
        let mode = info.st_mode & 0o777
        if mode & SecretFile.forbiddenBits != 0 {  // the services' rule (SecretFile), as a verdict
            verdict(
                "FAIL",
                "mode \(String(mode, radix: 8)) lets group or others \(mode & 0o044 != 0 ? "read" : "use") the key; chmod 600 \(path)"
            )
        } else {
            verdict("ok", "mode \(String(mode, radix: 8)): only its owner may read it")
        }
        if info.st_uid != geteuid() {
            verdict(
                "warn",
                "owned by uid \(info.st_uid), not by the user running this check (uid \(geteuid())); run it as the service's user"
            )
        }
        let signer: ClientSecretSigner
        do {
            signer = try ClientSecretSigner(privateKeyPEM: try readText(path: path))
            verdict("ok", "an unencrypted P-256 (ES256) private key")
        } catch let error as ClientSecretError {
            verdict(
                "FAIL",
                error.code == .notP256 ? "not a P-256 key: Apple's .p8 keys are EC P-256" : "\(error.detail)")
            return false
        } catch {
            verdict("FAIL", "\(error)")
            return false
        }
        let fileName = URL(fileURLWithPath: path).lastPathComponent
        var nameKeyID: String?
        if fileName.hasPrefix("AuthKey_"), fileName.hasSuffix(".p8") {
            nameKeyID = String(fileName.dropFirst("AuthKey_".count).dropLast(".p8".count))
        }
        if let keyID = parsed.value(AppleCredentialOptions.keyID.name) {
            if ClientSecretSigner.isWellFormedAppleID(keyID) {
                verdict("ok", "key ID \(keyID) is well formed")
            } else {
                verdict("FAIL", "key ID '\(keyID)' is not ten upper-case letters or digits")
            }
            if let nameKeyID, nameKeyID != keyID {
                verdict("warn", "the file name says key ID \(nameKeyID), but --apple-key-id is \(keyID)")
            }
        } else if let nameKeyID {
            verdict(
                ClientSecretSigner.isWellFormedAppleID(nameKeyID) ? "ok" : "warn",
                "key ID from the file name: \(nameKeyID)\(ClientSecretSigner.isWellFormedAppleID(nameKeyID) ? "" : " (not ten upper-case letters or digits)")"
            )
        } else {
            verdict(
                "warn",
                "no --apple-key-id and the file is not named AuthKey_KEYID.p8: the key ID was not checked")
        }
        if let teamID = parsed.value(AppleCredentialOptions.teamID.name) {
            if ClientSecretSigner.isWellFormedAppleID(teamID) {
                verdict("ok", "team ID \(teamID) is well formed")
            } else {
                verdict("FAIL", "team ID '\(teamID)' is not ten upper-case letters or digits")
            }
        }
        if let publicPath = parsed.value("public-key") {
            do {
                let expected = try ClientSecretVerifier(pem: try readText(path: publicPath))
                if expected.publicKeyPEM == signer.publicKeyPEM {
                    verdict("ok", "matches the public key in \(publicPath)")
                } else {
                    verdict("FAIL", "does not match the public key in \(publicPath)")
                }
            } catch {
                verdict("FAIL", "\(publicPath): \(error)")
            }
        }
        return failures == 0
    }
}
