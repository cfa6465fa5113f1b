"""The MPS daemons of DRA claims: ordered by the DRA plugin as files (`orders`), run by the MPS image."""
