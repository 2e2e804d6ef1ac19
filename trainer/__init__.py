"""Worker processes: model, data, training loop, optimizers (Canzona), decentralized training (GASLoC)."""
