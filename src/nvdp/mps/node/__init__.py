"""What an MPS daemon pod keeps on its node: the tmpfs MPS clients share (`shm`, `hostmount`, `host_setup`)
and which pod of the node runs the daemons (`handover`)."""
