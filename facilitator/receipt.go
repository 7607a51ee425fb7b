package facilitator

// Receipt is the public view of an authorization's status: what anyone holding the authorization's
// key (network, asset, payer, nonce) may read without an API key. Its fields are an allow-list,
// copied one by one from an AuthorizationStatus (PublicReceipt), so that a field added to the full
// view later never reaches the public one by default. Its JSON names are the full view's, so a
// client decodes either into an AuthorizationStatus.
//
// It never carries payment-identifier ids (a client may put something meaningful in them), API
// keys or their names, or webhooks. What it says beyond the chain is our own state of our own
// transaction, and only once that transaction has left us (status.Service.Public decides).
type Receipt struct {
	View          string         `json:"view"` // always "public"
	State         string         `json:"state"`
	Network       string         `json:"network"`
	Asset         string         `json:"asset"`
	Authorizer    string         `json:"authorizer"`
	Nonce         string         `json:"nonce"`
	Transaction   string         `json:"transaction,omitempty"`
	BlockNumber   uint64         `json:"blockNumber,omitempty"`
	Confirmations uint64         `json:"confirmations,omitempty"`
	Final         bool           `json:"final"`
	Finality      StatusFinality `json:"finality"`
	SettledBy     string         `json:"settledBy,omitempty"`
	To            string         `json:"to,omitempty"`
	Value         string         `json:"value,omitempty"`
	ValidBefore   string         `json:"validBefore,omitempty"`
	Reason        string         `json:"reason,omitempty"`
	Basis         string         `json:"basis"`
	Head          uint64         `json:"head"`
	// Batch lists a batch transaction's authorizations (all of them in its calldata).
	Batch    []BatchSettlement `json:"batch,omitempty"`
	Delivery *DeliveryRecord   `json:"delivery,omitempty"`
}

// ViewPublic is Receipt.View.
const ViewPublic = "public"

// PublicReceipt is the public view of st.
func PublicReceipt(st AuthorizationStatus) Receipt {
	return Receipt{View: ViewPublic, State: st.State, Network: st.Network, Asset: st.Asset, Authorizer: st.Authorizer, Nonce: st.Nonce,
		Transaction: st.Transaction, BlockNumber: st.BlockNumber, Confirmations: st.Confirmations, Final: st.Final, Finality: st.Finality,
		SettledBy: st.SettledBy, To: st.To, Value: st.Value, ValidBefore: st.ValidBefore, Reason: st.Reason, Basis: st.Basis, Head: st.Head,
		Batch: st.Batch, Delivery: st.Delivery}
}
