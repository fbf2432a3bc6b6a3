//! MySQL/MariaDB operator queries.

use super::MySqlDriver;
use crate::engine::AdminOps;

impl AdminOps for MySqlDriver {}
