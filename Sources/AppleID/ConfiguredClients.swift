import Foundation
public import ServiceSupport

/// The Apple ID clients a service builds from its settings: one per client ID, each with client secrets
/// minted from the team's `.p8` (shared by the receiver's sign-in API and the worker's revoker).
public struct ConfiguredClients: Sendable {
    /// The client for each client ID.
    public let clients: [String: AppleIDClient]
    /// Their client-secret providers (for the expiry gauge).
    public let providers: [ClientSecretProvider]

    /// Reads the `.p8` at `keyFile` and makes one client per ID in `clientIDs` against `baseURL`
    /// (Apple's by default). The file is read through ``SecretFile`` (refused when group or others may
    /// read it). Errors name the setting (`--apple-key-file`) and never carry key material.
    public init(
        keyFile: String, teamID: String, keyID: String, clientIDs: some Sequence<String>, baseURL: String?,
        environment: [String: String]
    ) throws(ConfigurationError) {
        let pem = try SecretFile.read(keyFile, setting: "--apple-key-file")
        let signer: ClientSecretSigner
        do {
            signer = try ClientSecretSigner(privateKeyPEM: String(decoding: pem, as: UTF8.self))
        } catch {
            throw ConfigurationError("--apple-key-file is not a P-256 private key (.p8)")
        }
        var clients: [String: AppleIDClient] = [:]
        var providers: [ClientSecretProvider] = []
        do {
            for clientID in Set(clientIDs).sorted() {
                let provider = ClientSecretProvider(
                    try .mint(signer: signer, teamID: teamID, keyID: keyID, clientID: clientID))
                providers.append(provider)
                clients[clientID] = try AppleIDClient(
                    configuration: AppleIDClient.Configuration(
                        baseURL: baseURL ?? "https://appleid.apple.com", environment: environment),
                    clientSecret: provider)
            }
        } catch {
            throw ConfigurationError("Apple client settings: \(error.detail)")
        }
        self.clients = clients
        self.providers = providers
    }
}
