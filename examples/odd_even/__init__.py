"""The running sums of odd and even numbers: keyed state, upserted to PostgreSQL."""
