"""03_train: train the drafter, export it; held-out evaluation during training."""
