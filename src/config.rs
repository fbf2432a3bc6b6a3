//! `icq.yaml`: sources, their settings and the handlers (placeholder; being written).
