//! sqlx-cli compatible migration files (placeholder; being written).
