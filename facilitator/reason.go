package facilitator

// Reason codes, spelled exactly as the official x402 packages (2.27) spell them so that merchants'
// error handling and the official clients' logs behave the same against us as against them.
// Only the codes reachable by the EVM exact scheme on EIP-3009 tokens are listed, plus the generic
// protocol codes and our own additions (marked).
const (
	// @x402/evm exact facilitator, EIP-3009 path.
	ReasonInvalidScheme         = "invalid_exact_evm_scheme"
	ReasonNetworkMismatch       = "invalid_exact_evm_network_mismatch"
	ReasonMissingEIP712Domain   = "invalid_exact_evm_missing_eip712_domain"
	ReasonRecipientMismatch     = "invalid_exact_evm_recipient_mismatch"
	ReasonInvalidSignature      = "invalid_exact_evm_signature"
	ReasonValidBefore           = "invalid_exact_evm_payload_authorization_valid_before"
	ReasonValidAfter            = "invalid_exact_evm_payload_authorization_valid_after"
	ReasonAuthorizationValue    = "invalid_exact_evm_authorization_value" // v1 amount check
	ReasonValueMismatch         = "invalid_exact_evm_payload_authorization_value_mismatch"
	ReasonTransactionFailed     = "invalid_exact_evm_transaction_failed"
	ReasonTransferEventMismatch = "invalid_exact_evm_transfer_event_mismatch"
	// ReasonBatchCallFailed: the settlement's call reverted inside a batch transaction that was
	// mined (the batch's other settlements stand), with the authorization unused and unexpired,
	// and its payer's balance short of it, or too close to validBefore to be settled again alone
	// (which is what happens otherwise).
	ReasonBatchCallFailed          = "batch_call_failed"
	ReasonTokenNameMismatch        = "invalid_exact_evm_token_name_mismatch"
	ReasonTokenVersionMismatch     = "invalid_exact_evm_token_version_mismatch"
	ReasonEIP3009NotSupported      = "invalid_exact_evm_eip3009_not_supported"
	ReasonNonceAlreadyUsed         = "invalid_exact_evm_nonce_already_used"
	ReasonInsufficientBalance      = "invalid_exact_evm_insufficient_balance"
	ReasonSimulationFailed         = "invalid_exact_evm_transaction_simulation_failed"
	ReasonFailedToParseSignature   = "invalid_exact_evm_failed_to_parse_signature"
	ReasonAssetNotDeployed         = "asset_not_deployed_contract"
	ReasonUnsupportedPayloadType   = "unsupported_payload_type"
	ReasonInvalidTransactionState  = "invalid_transaction_state"
	ReasonEIP6492FactoryNotAllowed = "eip6492_factory_not_allowed"
	ReasonSmartWalletDeployFailed  = "smart_wallet_deployment_failed"
	ReasonSettlementPending        = "settlement_pending"

	// Generic protocol codes (the x402 specification's generic error codes), used for requests that cannot be processed at all.
	ReasonInvalidPayload             = "invalid_payload"
	ReasonInvalidPaymentRequirements = "invalid_payment_requirements"
	ReasonInvalidNetwork             = "invalid_network"
	ReasonUnsupportedScheme          = "unsupported_scheme"
	ReasonInvalidX402Version         = "invalid_x402_version"
	ReasonUnexpectedVerifyError      = "unexpected_verify_error"
	ReasonUnexpectedSettleError      = "unexpected_settle_error"

	// Ours: additive codes that no official client misreads (they only surface them).
	ReasonPaymentIdentifierConflict = "payment_identifier_conflict"
	ReasonPaymentInFlight           = "payment_in_flight"
	ReasonInvalidPaymentIdentifier  = "invalid_payment_identifier"
)

// Refusals of the API-key guard (ours, additive): a refused request is neither verified nor sent.
const (
	// ReasonUnauthorized: no API key, or a malformed, unknown or revoked one (HTTP 401).
	ReasonUnauthorized = "unauthorized"
	// ReasonForbiddenScope: the API key lacks the route's scope (HTTP 403).
	ReasonForbiddenScope = "forbidden_scope"
	// ReasonPayToNotAllowed: the API key's payTo allow-list excludes the payment's payee (HTTP 403).
	ReasonPayToNotAllowed = "pay_to_not_allowed"
	// ReasonRateLimited: too many requests with the API key or from the client address (HTTP 429
	// with Retry-After).
	ReasonRateLimited = "rate_limited"
)

// ReasonNotFound answers a status query, or a webhook deletion, for a key nothing is known under
// (HTTP 404). Ours, additive.
const ReasonNotFound = "not_found"

// ReasonStatusTimeout answers a status or console read that did not finish within its bound (the
// node or the ledger did not answer in time): HTTP 503 with Retry-After; nothing was changed, and
// the same read may be sent again. Ours, additive.
const ReasonStatusTimeout = "status_timeout"

// ReasonNonCanonicalPath refuses a request whose path is not in its one canonical form (doubled
// slashes, dot segments, an encoded slash, or a letter, digit or one of "-._~" percent-encoded):
// HTTP 400, nothing is routed. Access is decided on the path as it is served, and only a
// canonical path is both. Ours, additive.
const ReasonNonCanonicalPath = "non_canonical_path"

// ReasonAlreadySettled answers a repeated /settle of an authorization whose success was already
// delivered to another caller: it carries the existing transaction, and is not a fresh success,
// so a merchant cannot serve twice for one payment (ARCHITECTURE.md invariant 4). Ours, additive.
const ReasonAlreadySettled = "already_settled"

// ReasonSettlerBusy answers a /settle refused because every signer's queue is full (HTTP 503 with
// Retry-After). Ours, additive.
const ReasonSettlerBusy = "settlement_capacity_exceeded"

// ReasonSignerUnavailable answers a /settle whose transaction the signer did not sign: a remote
// signer that is down, timed out or refused it (HTTP 503 with Retry-After). Nothing was committed
// or sent. Ours, additive.
const ReasonSignerUnavailable = "signer_unavailable"

// ReasonNetworkUnavailable answers a /verify or /settle for a network that is not serving yet:
// none of its RPC endpoints has answered since the process started, so its start-up checks (the
// chain, the tokens' domains) have not passed (HTTP 503 with Retry-After). Nothing was read or
// sent. Ours, additive.
const ReasonNetworkUnavailable = "network_unavailable"

// Limits and guards (ours, additive). Each refuses a /settle before anything is signed.
const (
	// ReasonWalletCapExceeded: the paying wallet reached its cap of settlements (count or amount)
	// per network and asset over the rolling window (HTTP 429 with Retry-After).
	ReasonWalletCapExceeded = "wallet_cap_exceeded"
	// ReasonGasBudgetExceeded: the merchant API key's gas budget for the last 24 hours would be
	// exceeded by this settlement's worst-case gas cost (HTTP 429 with Retry-After).
	ReasonGasBudgetExceeded = "gas_budget_exceeded"
	// ReasonInsufficientSignerFunds: every settlement signer of the network is below its minimum
	// native balance; the operator must fund them (HTTP 503 with Retry-After).
	ReasonInsufficientSignerFunds = "insufficient_signer_funds"
	// ReasonSignersRetiring: every settlement signer of the network is retiring (the operator is
	// rotating its keys and left it none that takes new settlements); nothing was signed (HTTP 503).
	ReasonSignersRetiring = "signers_retiring"
	// ReasonFeesAboveCap: the network's next base fee and the least tip are above the network's
	// max fee per gas (FeePolicy.MaxFee), so no transaction within it could be mined; nothing was
	// signed (HTTP 503 with Retry-After: fees fall again).
	ReasonFeesAboveCap = "network_fees_above_cap"
)
