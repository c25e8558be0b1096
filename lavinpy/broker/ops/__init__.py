"""What a face calls: the model's operations (the front door)."""
