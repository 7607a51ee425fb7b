// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// @notice Emits the events the block indexer follows (ERC-20 Transfer and EIP-3009
/// AuthorizationUsed), in bulk, for the indexer's backfill benchmark. Not a token.
contract Emitter {
    event Transfer(address indexed from, address indexed to, uint256 value);
    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);

    /// @notice Emits n Transfer and n AuthorizationUsed events.
    function emitMany(uint256 n) external {
        for (uint256 i = 0; i < n; i++) {
            emit Transfer(address(uint160(i + 1)), msg.sender, i);
            emit AuthorizationUsed(msg.sender, keccak256(abi.encode(block.number, i)));
        }
    }
}
