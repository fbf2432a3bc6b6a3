//! SQLite operator queries.

use super::SqliteDriver;
use crate::engine::AdminOps;

impl AdminOps for SqliteDriver {}
