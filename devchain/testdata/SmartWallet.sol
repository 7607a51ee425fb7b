// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// @notice Minimal ERC-1271 contract wallet for facilitator tests: a signature
/// is valid when it is a 65-byte (r, s, v) ECDSA signature by the owner over
/// exactly the given hash (no eth_sign prefix), which is what USDC's
/// SignatureChecker passes for EIP-3009 authorizations.
contract SmartWallet {
    bytes4 private constant MAGIC = 0x1626ba7e;
    bytes4 private constant INVALID = 0xffffffff;

    address public immutable owner;

    constructor(address owner_) {
        owner = owner_;
    }

    function isValidSignature(bytes32 hash, bytes calldata signature) external view returns (bytes4) {
        if (signature.length != 65) {
            return INVALID;
        }
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (v < 27) {
            v += 27;
        }
        address signer = ecrecover(hash, v, r, s);
        return signer != address(0) && signer == owner ? MAGIC : INVALID;
    }
}
