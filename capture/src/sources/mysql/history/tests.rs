use super::*;

fn facts_of(f: &ShapeFacts, db: &str, t: &str) -> Option<(Vec<String>, Vec<String>)> {
    let all: Vec<TableFacts> = f.clone().into();
    all.into_iter()
        .find(|x| x.database == db && x.table == t)
        .map(|x| (x.tinyint1, x.json))
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn create_table_declares_tinyint1_and_mariadb_json() {
    let mut f = ShapeFacts::default();
    let touched = f.apply_ddl(
        "shop",
        "CREATE TABLE IF NOT EXISTS `orders` (
            id int NOT NULL AUTO_INCREMENT, -- a comment, (with parens
            `Flag` TINYINT(1) NOT NULL DEFAULT '0', wide tinyint(4), b bool,
            doc json, other longtext CHECK (json_valid(`other`)), txt longtext,
            d decimal(10,2) /* 'x' */ DEFAULT 1.5,
            PRIMARY KEY (id), KEY k (wide, d),
            CONSTRAINT c CHECK (json_valid(txt))
        ) ENGINE=InnoDB /*!50100 PARTITION BY HASH (id) */",
    );
    assert_eq!(touched, vec![("shop".to_string(), "orders".to_string())]);
    assert_eq!(
        facts_of(&f, "shop", "orders"),
        Some((names(&["b", "flag"]), names(&["doc", "other", "txt"])))
    );
    // As catalog columns the shape applies.
    let cat = f.catalog("shop", "orders").unwrap();
    assert!(cat
        .iter()
        .any(|c| c.name == "flag" && c.column_type == "tinyint(1)" && !c.json));
    assert!(f.catalog("shop", "nope").is_none());
}

#[test]
fn alter_table_changes_renames_and_drops_columns() {
    let mut f = ShapeFacts::default();
    f.apply_ddl(
        "db",
        "CREATE TABLE t (id int, b1 tinyint(1), js json, keep tinyint(1))",
    );
    f.apply_ddl(
        "db",
        "ALTER TABLE db.t MODIFY COLUMN b1 int, CHANGE js doc text, ADD COLUMN n tinyint(1) AFTER id, \
         ADD (j2 json, x int), RENAME COLUMN keep TO kept, ADD INDEX (n)",
    );
    assert_eq!(
        facts_of(&f, "db", "t"),
        Some((names(&["kept", "n"]), names(&["j2"])))
    );
    f.apply_ddl(
        "db",
        "ALTER TABLE t DROP COLUMN n, DROP CONSTRAINT j2, DROP INDEX n",
    );
    assert_eq!(facts_of(&f, "db", "t"), Some((names(&["kept"]), vec![])));
    f.apply_ddl(
        "db",
        "ALTER TABLE t ADD CONSTRAINT j CHECK (json_valid(`other`)), RENAME TO u",
    );
    assert_eq!(facts_of(&f, "db", "t"), None);
    assert_eq!(
        facts_of(&f, "db", "u"),
        Some((names(&["kept"]), names(&["other"])))
    );
}

#[test]
fn rename_drop_like_and_select_move_copy_or_forget() {
    let mut f = ShapeFacts::default();
    f.apply_ddl("a", "CREATE TABLE t (b tinyint(1))");
    f.apply_ddl("a", "RENAME TABLE t TO b.t2, x TO y");
    assert!(!f.knows("a", "t") && f.knows("b", "t2"));
    f.apply_ddl("b", "CREATE TABLE t3 LIKE t2");
    assert_eq!(facts_of(&f, "b", "t3"), Some((names(&["b"]), vec![])));
    f.apply_ddl("b", "DROP TABLE IF EXISTS t2, `t3`");
    assert!(!f.knows("b", "t2") && !f.knows("b", "t3"));
    f.set_from_catalog(
        "b",
        "s",
        &[CatalogColumn {
            name: "Z".into(),
            column_type: "tinyint(1) unsigned".into(),
            json: false,
        }],
    );
    assert_eq!(facts_of(&f, "b", "s"), Some((names(&["z"]), vec![])));
    // Columns from a SELECT are not in the text: forgotten, read at the
    // next TABLE_MAP.
    f.apply_ddl(
        "b",
        "CREATE OR REPLACE TABLE s (extra int) SELECT * FROM other",
    );
    assert!(!f.knows("b", "s"));
    // Statements that change no table's facts.
    let before = f.clone();
    assert!(f.apply_ddl("b", "CREATE INDEX i ON s (z)").is_empty());
    assert!(f.apply_ddl("b", "TRUNCATE TABLE s").is_empty());
    assert_eq!(f, before);
}

#[test]
fn facts_are_stored_as_compact_json_and_read_back() {
    let mut f = ShapeFacts::default();
    f.apply_ddl("shop", "CREATE TABLE t (a tinyint(1), j json, n int)");
    f.apply_ddl("shop", "CREATE TABLE plain (n int)");
    let text = serde_json::to_string(&f).unwrap();
    assert_eq!(
        text,
        r#"[{"database":"shop","table":"plain","ids":{"oid":1585242466,"columns":{"n":1}}},{"database":"shop","table":"t","tinyint1":["a"],"json":["j"],"ids":{"oid":301962348,"columns":{"a":1,"j":2,"n":3}}}]"#
    );
    let back: ShapeFacts = serde_json::from_str(&text).unwrap();
    assert_eq!(back, f);
}

#[test]
fn create_table_if_not_exists_leaves_a_known_table_as_it_is() {
    let mut f = ShapeFacts::default();
    f.apply_ddl("db", "CREATE TABLE IF NOT EXISTS t (a tinyint(1))");
    assert_eq!(facts_of(&f, "db", "t"), Some((names(&["a"]), vec![])));
    // Logged although t exists: nothing changes.
    assert!(f
        .apply_ddl("db", "CREATE TABLE IF NOT EXISTS t (a int, j json)")
        .is_empty());
    assert_eq!(facts_of(&f, "db", "t"), Some((names(&["a"]), vec![])));
    f.apply_ddl("db", "CREATE OR REPLACE TABLE t (a int, j json)");
    assert_eq!(facts_of(&f, "db", "t"), Some((vec![], names(&["j"]))));
}

/// A record stored inside a DDL's transaction resumes from its start and
/// derives the DDL again: it must carry the facts from before it.
#[test]
fn facts_at_a_transaction_s_start_are_those_before_its_ddl() {
    let mut f = ShapeFacts::default();
    f.apply_ddl(
        "shop",
        "CREATE TABLE t (id int PRIMARY KEY, flag tinyint(1))",
    );
    let before = f.clone();
    let mut tx = TransactionFacts::new(f);
    assert_eq!(tx.at_start(), &before);
    tx.change()
        .apply_ddl("shop", "ALTER TABLE t MODIFY flag int");
    assert_eq!(facts_of(tx.now(), "shop", "t"), Some((vec![], vec![])));
    assert_eq!(tx.at_start(), &before);
    // A second change in the same transaction keeps the start's copy.
    tx.change()
        .apply_ddl("shop", "ALTER TABLE t ADD COLUMN b tinyint(1)");
    assert_eq!(tx.at_start(), &before);
    tx.commit();
    assert_eq!(tx.at_start(), tx.now());
    assert_eq!(
        facts_of(tx.at_start(), "shop", "t"),
        Some((names(&["b"]), vec![]))
    );
}

/// The identity of `db.t` described with columns `cols`: each column's
/// number and the dropped ones.
fn ids_of(f: &ShapeFacts, db: &str, t: &str, cols: &[&str]) -> (Vec<Option<i16>>, Vec<i16>) {
    let id = f
        .ids(db, t)
        .expect("known table")
        .identity(cols.iter().copied());
    (id.attnums, id.dropped)
}

#[test]
fn a_renamed_column_keeps_its_number_and_a_dropped_one_is_never_given_again() {
    let mut f = ShapeFacts::default();
    f.apply_ddl(
        "db",
        "CREATE TABLE t (id int PRIMARY KEY, a int, b int, c int)",
    );
    assert_eq!(
        ids_of(&f, "db", "t", &["id", "a", "b", "c"]),
        (vec![Some(1), Some(2), Some(3), Some(4)], vec![])
    );
    // MySQL 8 / MariaDB 10.5+ syntax, then a new column under the old name.
    f.apply_ddl("db", "ALTER TABLE t RENAME COLUMN a TO a2");
    f.apply_ddl("db", "ALTER TABLE t ADD COLUMN a varchar(10)");
    // DROP COLUMN, and DROP without COLUMN.
    f.apply_ddl("db", "ALTER TABLE t DROP COLUMN b");
    f.apply_ddl("db", "ALTER TABLE t DROP c");
    // A column dropped and added again under its name is another column.
    f.apply_ddl("db", "ALTER TABLE t ADD b int");
    assert_eq!(
        ids_of(&f, "db", "t", &["id", "a2", "a", "b"]),
        (vec![Some(1), Some(2), Some(5), Some(6)], vec![3, 4])
    );
    // An older description (a replayed event) still names its columns; a
    // column it has is not reported dropped by it.
    assert_eq!(
        ids_of(&f, "db", "t", &["id", "A", "b"]),
        (vec![Some(1), Some(5), Some(6)], vec![3, 4])
    );
}

#[test]
fn change_renames_or_widens_and_one_alter_may_do_several_things() {
    let mut f = ShapeFacts::default();
    f.apply_ddl(
        "db",
        "CREATE TABLE t (id int, a int, b smallint, c text, d int)",
    );
    // CHANGE old new type (both syntaxes' rename), CHANGE a column to its
    // own name (a widening), MODIFY, DROP and ADD in one statement.
    f.apply_ddl(
        "db",
        "ALTER TABLE t CHANGE a a_new INT NOT NULL, CHANGE COLUMN b b BIGINT, \
         MODIFY c longtext, DROP COLUMN d, ADD COLUMN e int AFTER id, \
         RENAME COLUMN c TO c2, ADD INDEX i (e)",
    );
    assert_eq!(
        ids_of(&f, "db", "t", &["id", "e", "a_new", "b", "c2"]),
        (vec![Some(1), Some(6), Some(2), Some(3), Some(4)], vec![5])
    );
    // Case does not make another column (MySQL compares names so).
    f.apply_ddl("db", "ALTER TABLE t CHANGE `A_NEW` `Renamed` int");
    assert_eq!(
        ids_of(&f, "db", "t", &["Renamed"]),
        (vec![Some(2)], vec![5])
    );
}

#[test]
fn backquoted_names_with_odd_characters_are_followed() {
    let mut f = ShapeFacts::default();
    f.apply_ddl(
        "db",
        "CREATE TABLE `odd table` (`id` int, `we``ird, col` int, `naïve é` text, `key` int)",
    );
    f.apply_ddl(
        "db",
        "ALTER TABLE `db`.`odd table` RENAME COLUMN `we``ird, col` TO `new ``name`, \
         CHANGE `naïve é` `ÜBER (x)` mediumtext, DROP `key`",
    );
    assert_eq!(
        ids_of(&f, "db", "odd table", &["id", "new `name", "über (x)"]),
        (vec![Some(1), Some(2), Some(3)], vec![4])
    );
}

#[test]
fn a_table_created_again_is_another_table_and_a_copy_keeps_the_numbers() {
    let mut f = ShapeFacts::default();
    f.apply_ddl("db", "CREATE TABLE t (id int, a int)");
    let first = f.ids("db", "t").unwrap().oid;
    f.apply_ddl("db", "ALTER TABLE t DROP a");
    f.apply_ddl("db", "CREATE TABLE u LIKE t");
    assert_eq!(ids_of(&f, "db", "u", &["id"]), (vec![Some(1)], vec![2]));
    assert_ne!(f.ids("db", "u").unwrap().oid, first);
    f.apply_ddl("db", "DROP TABLE t");
    assert!(f.ids("db", "t").is_none());
    f.apply_ddl("db", "CREATE TABLE t (id bigint, b int)");
    assert_ne!(f.ids("db", "t").unwrap().oid, first);
    // A renamed table keeps its numbers.
    f.apply_ddl("db", "RENAME TABLE u TO v");
    assert_eq!(ids_of(&f, "db", "v", &["id"]), (vec![Some(1)], vec![2]));
}

#[test]
fn numbers_are_stored_with_the_facts_and_a_replay_derives_the_same() {
    let ddl = [
        "CREATE TABLE t (id int, a tinyint(1), b int)",
        "ALTER TABLE t RENAME COLUMN a TO a2, ADD a int",
        "ALTER TABLE t DROP b",
    ];
    let mut f = ShapeFacts::default();
    f.apply_ddl("db", ddl[0]);
    let stored = serde_json::to_string(&f).unwrap();
    for sql in &ddl[1..] {
        f.apply_ddl("db", sql);
    }
    // Resumed from the position stored after the CREATE.
    let mut replay: ShapeFacts = serde_json::from_str(&stored).unwrap();
    for sql in &ddl[1..] {
        replay.apply_ddl("db", sql);
    }
    assert_eq!(replay, f);
    assert_eq!(
        ids_of(&replay, "db", "t", &["id", "a2", "a"]),
        (vec![Some(1), Some(2), Some(4)], vec![3])
    );
    // Facts stored before columns had numbers: numbered at the TABLE_MAP.
    let mut old: ShapeFacts =
        serde_json::from_str(r#"[{"database":"db","table":"t","tinyint1":["a"]}]"#).unwrap();
    assert!(old.ids("db", "t").is_none());
    old.number_columns("db", "t", &names(&["id", "a"]));
    assert_eq!(
        ids_of(&old, "db", "t", &["id", "a"]),
        (vec![Some(1), Some(2)], vec![])
    );
    // An unknown table is left to the catalog.
    old.number_columns("db", "nope", &names(&["x"]));
    assert!(old.ids("db", "nope").is_none());
}

#[test]
fn a_table_numbered_at_a_table_map_is_another_table_than_the_snapshots() {
    let cols = |names: &[&str]| -> Vec<CatalogColumn> {
        names
            .iter()
            .map(|n| CatalogColumn {
                name: n.to_string(),
                column_type: "int(11)".into(),
                json: false,
            })
            .collect()
    };
    let mut snap = ShapeFacts::default();
    snap.set_from_catalog("db", "t", &cols(&["id", "A"]));
    let mut seen = ShapeFacts::default();
    seen.set_from_table_map("db", "t", &cols(&["id", "A"]), 42);
    assert_eq!(
        ids_of(&snap, "db", "t", &["a", "id"]),
        (vec![Some(2), Some(1)], vec![])
    );
    assert_eq!(
        ids_of(&seen, "db", "t", &["id", "a"]),
        (vec![Some(1), Some(2)], vec![])
    );
    assert_ne!(
        snap.ids("db", "t").unwrap().oid,
        seen.ids("db", "t").unwrap().oid
    );
    // Read again (a replay meets the same table id): the same table.
    let mut again = ShapeFacts::default();
    again.set_from_table_map("db", "t", &cols(&["id", "A"]), 42);
    assert_eq!(again, seen);
}
