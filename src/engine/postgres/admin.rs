//! PostgreSQL operator queries.

use super::PgDriver;
use crate::engine::AdminOps;

impl AdminOps for PgDriver {}
