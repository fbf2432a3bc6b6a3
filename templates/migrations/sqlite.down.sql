-- icq: removes everything the matching up migration created for {{table}}.
DROP TABLE IF EXISTS {{table}};
