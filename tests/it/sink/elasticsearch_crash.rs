//! SIGKILL `oncely sink` (elasticsearch) again and again while a real `oncely
//! capture` streams a mixed workload: every index must end up equal to its
//! source table — same ids, same fields, deleted rows gone.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use elasticsearch::http::transport::Transport;
use elasticsearch::indices::{IndicesDeleteParts, IndicesRefreshParts};
use elasticsearch::{Elasticsearch, SearchParts};
use oncely_sinks::kinds::elasticsearch::config::{
    DEFAULT_VERSION_LSN_FIELD, DEFAULT_VERSION_SEQ_FIELD,
};
use serde_json::{json, Value};

use crate::harness::capture::{kill9, terminate, CaptureEnv};
use crate::harness::common;
use crate::harness::runner::{sigterm, spawn_runner, wait_exit, write_config};
use crate::harness::sink::{
    captured_source, kill_runners_while, row_differences, runner_config, source_rows, workload,
    TABLES,
};

const KILLS: usize = 12;
const SOFT_FLAG: &str = "__deleted";

fn es() -> Elasticsearch {
    Elasticsearch::new(Transport::single_node(&common::es_url()).expect("es transport"))
}

/// Every document of `index` after a refresh: id -> source (an absent index is empty).
async fn documents(client: &Elasticsearch, index: &str) -> anyhow::Result<BTreeMap<String, Value>> {
    client
        .indices()
        .refresh(IndicesRefreshParts::Index(&[index]))
        .send()
        .await?;
    let response = client
        .search(SearchParts::Index(&[index]))
        .body(json!({"size": 10000, "track_total_hits": true, "query": {"match_all": {}}}))
        .send()
        .await?;
    if response.status_code().as_u16() == 404 {
        return Ok(BTreeMap::new());
    }
    let body: Value = response.json().await?;
    let hits = body["hits"]["hits"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(
        body["hits"]["total"]["value"].as_u64() == Some(hits.len() as u64),
        "more than one page of documents in {index}"
    );
    Ok(hits
        .into_iter()
        .filter_map(|h| {
            let mut source = h["_source"].clone();
            // Every document carries its version beside the row's columns.
            let source_map = source.as_object_mut()?;
            source_map.shift_remove(DEFAULT_VERSION_LSN_FIELD)?;
            source_map.shift_remove(DEFAULT_VERSION_SEQ_FIELD)?;
            Some((h["_id"].as_str()?.to_owned(), source))
        })
        .collect())
}

/// Differences between each table and its index, empty when they are equal.
/// With `soft` (`delete.mode = "soft"`), flagged documents count as deleted
/// and the flag is removed from the others before comparing.
async fn differences(
    env: &CaptureEnv,
    client: &Elasticsearch,
    soft: bool,
) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for table in TABLES {
        let want = source_rows(&env.client, table).await?;
        let mut got = documents(client, &env.topic(table)).await?;
        if soft {
            got.retain(|_, doc| doc[SOFT_FLAG] == json!(false));
            for doc in got.values_mut() {
                doc.as_object_mut().map(|d| d.remove(SOFT_FLAG));
            }
        }
        out.extend(row_differences(table, "index", &want, &got));
    }
    Ok(out)
}

/// Waits until every index equals its table (empty result) or 180 s passed
/// (the differences); an error if the sink exits on its own.
async fn converge(
    env: &CaptureEnv,
    client: &Elasticsearch,
    sink: &mut std::process::Child,
    soft: bool,
) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let diff = differences(env, client, soft).await?;
        if diff.is_empty() || Instant::now() > deadline {
            return Ok(diff);
        }
        if let Some(status) = sink.try_wait()? {
            anyhow::bail!("the last sink exited with {status}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_sink_leaves_every_index_equal_to_its_table() -> anyhow::Result<()> {
    crash_run(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_soft_deleting_sink_leaves_every_index_equal_to_its_table() -> anyhow::Result<()>
{
    crash_run(true).await
}

/// The workload under SIGKILLs, in `delete.mode = "soft"` when `soft`.
async fn crash_run(soft: bool) -> anyhow::Result<()> {
    let (env, mut capture, topics) =
        captured_source(if soft { "es_crash_soft" } else { "es_crash" }).await?;

    let group = common::unique("es_crash_g");
    let sink_config = write_config(
        &env.dir,
        "sink",
        &format!(
            "{runner}[sink]\nkind = \"elasticsearch\"\nurl = \"{url}\"\nbulk.max.actions = 200\n{mode}",
            runner = runner_config(&group, &topics, 50, ""),
            url = common::es_url(),
            mode = if soft { "delete.mode = \"soft\"\n" } else { "" },
        ),
    );
    let log = env.dir.join("sink.log");

    let writer_client = env.connect().await?;
    let writer = tokio::spawn(async move { workload(writer_client, 1200).await });
    let kills = kill_runners_while(&sink_config, &log, &writer, KILLS).await?;
    writer.await??;

    let client = es();
    let mut sink = spawn_runner(&sink_config, &log);
    let diff = converge(&env, &client, &mut sink, soft).await;
    if matches!(sink.try_wait(), Ok(None)) {
        sigterm(&sink);
    }
    let status = wait_exit(&mut sink, Duration::from_secs(30)).await;
    let capture_status = terminate(&mut capture, Duration::from_secs(30));
    for t in &topics {
        let _ = client
            .indices()
            .delete(IndicesDeleteParts::Index(&[t.as_str()]))
            .send()
            .await;
    }
    if capture_status.is_err() {
        kill9(&mut capture);
    }
    let diff = diff.map_err(|e| anyhow::anyhow!("{e}; sink log: {}", log.display()))?;
    assert!(
        diff.is_empty(),
        "indices differ from tables after {kills} kills: {diff:#?}"
    );
    assert!(status.success(), "graceful stop exits 0, got {status}");
    assert!(kills >= KILLS);
    env.cleanup().await;
    Ok(())
}
