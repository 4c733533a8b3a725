"""The knob catalog and what each knob means as plain data (backend flags, loader, optimizer and DDP keyword arguments). No torch."""
