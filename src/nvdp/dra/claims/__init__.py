"""The claim transaction: a claim's record, its checkpoint, prepare and undo, MIG devices, CDI specs."""
