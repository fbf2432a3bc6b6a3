//! Row decoding that never fails a statement for the rows around it.
//!
//! The table is shared with other programs, so any column may hold anything the schema
//! allows. Each column is decoded on its own; a column that cannot be decoded leaves a
//! neutral placeholder in the [`CommandRow`] and a defect naming the column and the
//! reason. The processor dead-letters a claimed row with defects without running it, and
//! the operator listings show it, so one bad row never hides or blocks the others.

use std::fmt::Display;

use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::command::{CommandId, CommandRow, Context, LeaseToken};

/// Collects the defects of one row while its columns are decoded.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    defects: Vec<String>,
}

impl Decoder {
    /// Records `result`'s error against `column`, returning the value when there is one.
    pub(crate) fn take<T, E: Display>(&mut self, column: &str, result: Result<T, E>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(err) => {
                self.defect(column, err);
                None
            }
        }
    }

    /// Records a defect of `column`.
    pub(crate) fn defect(&mut self, column: &str, reason: impl Display) {
        let reason = reason.to_string();
        // Driver messages can be long (a whole payload); the reason only needs its start.
        let reason: String = if reason.chars().count() > 300 {
            reason.chars().take(300).chain("…".chars()).collect()
        } else {
            reason
        };
        self.defects.push(format!("column {column}: {reason}"));
    }

    /// Decodes `column` of `row` as `T`.
    pub(crate) fn get<'r, R, T>(&mut self, row: &'r R, column: &str) -> Option<T>
    where
        R: Row,
        T: Decode<'r, R::Database> + Type<R::Database>,
        for<'c> &'c str: ColumnIndex<R>,
    {
        let result = row.try_get::<T, _>(column);
        self.take(column, result)
    }

    /// Parses a JSON document borrowed from the row (no copy of its text is made).
    pub(crate) fn json_str(&mut self, column: &str, text: Option<&str>) -> serde_json::Value {
        match text {
            None => serde_json::Value::Null,
            Some(text) => self
                .take(column, serde_json::from_str(text))
                .unwrap_or(serde_json::Value::Null),
        }
    }

    /// The defects found, to store in the decoded row.
    pub(crate) fn finish(self, mut row: CommandRow) -> CommandRow {
        row.defects = self.defects;
        row
    }
}

/// Decodes the text columns every engine stores the same way (`Type`, `LastError` and
/// the captured context) into `out`.
pub(crate) fn text_columns<R>(d: &mut Decoder, row: &R, out: &mut CommandRow)
where
    R: Row,
    String: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    out.type_name = d.get::<R, String>(row, "Type").unwrap_or_default();
    out.last_error = d.get::<R, Option<String>>(row, "LastError").flatten();
    out.user_id = d.get::<R, Option<String>>(row, "UserId").flatten();
    let roles = d.get::<R, Option<String>>(row, "Roles").flatten();
    out.roles = Context::parse_roles(roles.as_deref());
    out.tenant_id = d.get::<R, Option<String>>(row, "TenantId").flatten();
    out.correlation_id = d.get::<R, Option<String>>(row, "CorrelationId").flatten();
}

/// Decodes `Attempts`: a count that fits `i32`. NULL, a value beyond 32 bits or one that
/// is not a number is a defect naming what was stored (the claim leaves such a value as
/// it is), so the row is dead-lettered saying what was wrong rather than as a row that
/// used up its attempts. A negative count decodes as stored; the executor refuses it.
pub(crate) fn attempts<R>(d: &mut Decoder, row: &R) -> i32
where
    R: Row,
    Option<i64>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    Option<i32>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    let value = match row.try_get::<Option<i64>, _>("Attempts") {
        Ok(value) => Ok(value),
        Err(first) => row
            .try_get::<Option<i32>, _>("Attempts")
            .map(|v| v.map(i64::from))
            .map_err(|_| first),
    };
    match value {
        Ok(Some(n)) => i32::try_from(n).unwrap_or_else(|_| {
            d.defect(
                "Attempts",
                format!("{n} is out of range (an attempt count is 0 to 2147483647)"),
            );
            0
        }),
        Ok(None) => {
            d.defect("Attempts", "NULL (an attempt count is 0 or more)");
            0
        }
        Err(err) => {
            d.defect("Attempts", err);
            0
        }
    }
}

/// A lease token stored as text: another program's token that is not a UUID is shown as
/// absent (the next claim overwrites it anyway).
pub(crate) fn text_token(text: Option<String>) -> Option<LeaseToken> {
    text.and_then(|t| uuid::Uuid::parse_str(&t).ok())
        .map(LeaseToken)
}

/// The id of a row from an engine that stores it as text, exactly as stored.
pub(crate) fn text_id<R>(row: &R) -> Result<CommandId, sqlx::Error>
where
    R: Row,
    String: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    row.try_get::<String, _>("Id").map(CommandId::stored)
}
