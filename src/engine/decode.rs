//! Row decoding that never fails a statement for the rows around it.
//!
//! The table is shared with other programs, so any column may hold anything the schema
//! allows. Each column is decoded on its own; a column that cannot be decoded leaves a
//! neutral placeholder in the [`CommandRow`] and a defect naming the column and the
//! reason. The processor dead-letters a claimed row with defects without running it, and
//! the operator listings show it, so one bad row never hides or blocks the others.

use std::fmt::Display;

use sqlx::{ColumnIndex, Decode, Row, Type, ValueRef};

#[cfg(any(feature = "sqlite", feature = "mysql"))]
use crate::command::{CommandId, LeaseToken};
use crate::command::{CommandRow, Context};

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
    #[cfg(any(feature = "sqlite", feature = "mysql"))]
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

/// Decodes the text columns every engine stores the same way (`Type`, `LastError`, the
/// captured context and, where the row has them, the version-4 keys and `Errors`) into
/// `out`.
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
    if has_column(row, "OrderKey") {
        out.concurrency_key = d.get::<R, Option<String>>(row, "ConcurrencyKey").flatten();
        out.order_key = d.get::<R, Option<String>>(row, "OrderKey").flatten();
        out.errors = d.get::<R, Option<String>>(row, "Errors").flatten();
    }
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
    let narrow = narrower::<R, Option<i32>>(row, "Attempts")
        .then(|| row.try_get::<Option<i32>, _>("Attempts").ok())
        .flatten();
    let value = match narrow.map_or_else(
        || row.try_get::<Option<i64>, _>("Attempts"),
        |v| Ok(v.map(i64::from)),
    ) {
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
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn text_token(text: Option<String>) -> Option<LeaseToken> {
    text.and_then(|t| uuid::Uuid::parse_str(&t).ok())
        .map(LeaseToken)
}

/// The id of a row from an engine that stores it as text, exactly as stored.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn text_id<R>(row: &R) -> Result<CommandId, sqlx::Error>
where
    R: Row,
    String: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    row.try_get::<String, _>("Id").map(CommandId::stored)
}

/// Whether the row has `column` (a version-2 column is absent on a version-1 table).
pub(crate) fn has_column<R>(row: &R, column: &str) -> bool
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
{
    row.try_column(column).is_ok()
}

/// Whether `column` holds a non-NULL value that `T` decodes and an `i64` does not (an
/// `int4` or `int2` column): decoded as `T` first, it costs no failed `try_get`, which
/// builds an error message (the v2 row has three such columns: `Priority`, `Attempts`,
/// `Snoozes`).
fn narrower<R, T>(row: &R, column: &str) -> bool
where
    R: Row,
    T: Type<R::Database>,
    Option<i64>: Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    row.try_get_raw(column).is_ok_and(|raw| {
        if raw.is_null() {
            return false;
        }
        let ty = raw.type_info();
        !<Option<i64> as Type<R::Database>>::compatible(&ty) && T::compatible(&ty)
    })
}

/// A small integer column (`Priority`, `Snoozes`) as a 64-bit number, whatever integer
/// width the engine decodes it with; `Err` for a value that is not an integer (a SQLite
/// REAL or text another program wrote).
fn integer<R>(row: &R, column: &str) -> Result<Option<i64>, sqlx::Error>
where
    R: Row,
    Option<i64>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    Option<i32>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    Option<i16>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    // The column's own width first (see [`narrower`]).
    if narrower::<R, Option<i32>>(row, column)
        && let Ok(v) = row.try_get::<Option<i32>, _>(column)
    {
        return Ok(v.map(i64::from));
    }
    if narrower::<R, Option<i16>>(row, column)
        && let Ok(v) = row.try_get::<Option<i16>, _>(column)
    {
        return Ok(v.map(i64::from));
    }
    row.try_get::<Option<i64>, _>(column).or_else(|first| {
        row.try_get::<Option<i32>, _>(column)
            .map(|v| v.map(i64::from))
            .or_else(|_| {
                row.try_get::<Option<i16>, _>(column)
                    .map(|v| v.map(i64::from))
            })
            .map_err(|_| first)
    })
}

/// Decodes the version-2 columns (`Queue`, `Priority`, `UniqueKey`, `TraceParent`,
/// `Snoozes`) into `out`; on a version-1 table (no `Queue` column) they keep their
/// defaults. A `Queue` that is NULL or not text and a `Priority` that is NULL, not an
/// integer or outside `i16` are defects: the row is dead-lettered naming the column.
/// A NULL `Snoozes` (a relaxed column) counts as none.
pub(crate) fn v2_columns<R>(d: &mut Decoder, row: &R, out: &mut CommandRow)
where
    R: Row,
    String: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    Option<i64>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    Option<i32>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    Option<i16>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    if !has_column(row, "Queue") {
        return;
    }
    match d.get::<R, Option<String>>(row, "Queue") {
        Some(Some(queue)) => out.queue = queue,
        Some(None) => d.defect("Queue", "NULL (a queue name is text)"),
        None => {}
    }
    match integer(row, "Priority") {
        Ok(Some(n)) => match i16::try_from(n) {
            Ok(priority) => out.priority = priority,
            Err(_) => d.defect(
                "Priority",
                format!("{n} is out of range (a priority is -32768 to 32767)"),
            ),
        },
        Ok(None) => d.defect("Priority", "NULL (a priority is an integer)"),
        Err(err) => d.defect("Priority", format!("not an integer ({err})")),
    }
    out.unique_key = d.get::<R, Option<String>>(row, "UniqueKey").flatten();
    out.trace_parent = d.get::<R, Option<String>>(row, "TraceParent").flatten();
    match integer(row, "Snoozes") {
        Ok(Some(n)) => {
            out.snoozes = i32::try_from(n.max(0)).unwrap_or(i32::MAX);
        }
        Ok(None) => {}
        Err(err) => d.defect("Snoozes", format!("not an integer ({err})")),
    }
}
