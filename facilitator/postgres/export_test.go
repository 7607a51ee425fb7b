package postgres

// SettlementByKeySQL is SettlementByKey's statement, for the plan tests.
const SettlementByKeySQL = settlementByKeySQL
