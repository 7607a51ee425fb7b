// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// @notice A hostile ERC-1271 wallet for facilitator tests: isValidSignature burns all but a
/// little of the gas it is given, then answers valid. Put at an address that had no code when its
/// payment was verified (as an EIP-7702 delegation can be), it makes the token's call of it use
/// up what a Multicall3 batch had left for its other calls.
contract GreedyWallet {
    bytes4 private constant MAGIC = 0x1626ba7e;

    function isValidSignature(bytes32, bytes calldata) external view returns (bytes4) {
        uint256 spins;
        while (gasleft() > 3000) {
            spins++;
        }
        return spins == type(uint256).max ? bytes4(0) : MAGIC;
    }
}
