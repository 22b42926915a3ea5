//! `strata store bench`: the load generator.

use super::*;

pub(super) fn bench(args: BenchArgs) -> Result<i32> {
    use strata_store::bench::{run, run_batched_gets, BenchConfig, Workload};
    let size = parse_size(&args.size).map_err(anyhow::Error::msg)?;
    let workload = match (args.workload.as_str(), args.http) {
        ("post", _) => Workload::Post,
        ("get", _) => Workload::Get,
        (_, Some(server)) => Workload::HttpGet(server),
        (_, None) => bail!("--workload http needs --http ADDR"),
    };
    let cfg = BenchConfig {
        threads: args.threads.max(1),
        ops: args.ops.max(1),
        passes: args.passes.max(1),
        size,
        prefix: args.prefix.clone(),
        workload,
    };
    let batched = args.engine == "batched";
    if batched && !matches!(cfg.workload, Workload::Get) {
        bail!("--engine batched runs --workload get only");
    }
    let r = runtime()?.block_on(async {
        let credential = args.tenant.load()?;
        let client = std::sync::Arc::new(Client::connect(args.cluster.cluster, credential).await?);
        let choice = args.replica_choice.parse().map_err(anyhow::Error::msg)?;
        client.set_replica_choice(choice);
        if batched {
            let table = client.table();
            let credential = client.credential().clone();
            let result =
                tokio::task::block_in_place(|| run_batched_gets(&table, &credential, &cfg))?;
            return anyhow::Ok((result, json!(null)));
        }
        let result = run(client.clone(), cfg).await?;
        let view = super::status::client_view_json(client.replica_choice(), &client.replica_view());
        anyhow::Ok((result, view))
    })?;
    let (r, view) = r;
    let secs = r.elapsed.as_secs_f64();
    let v = json!({
        "workload": args.workload,
        "threads": args.threads,
        "size": size,
        "ops": r.ops,
        "errors": r.errors,
        "seconds": secs,
        "ops_per_s": r.ops as f64 / secs,
        "mb_per_s": r.bytes as f64 / secs / 1e6,
        "p50_ms": r.p50.as_secs_f64() * 1e3,
        "p99_ms": r.p99.as_secs_f64() * 1e3,
        // Zero-byte Gets (--engine batched) read no replica: null.
        "client": view,
    });
    if args.cluster.output == Output::Json {
        println!("{v}");
    } else {
        println!(
            "{} x{} {}: {} ops ({} errors) in {secs:.2} s, {:.0} ops/s, {:.1} MB/s, p50 {:.2} ms, p99 {:.2} ms",
            args.workload,
            args.threads,
            human(size),
            r.ops,
            r.errors,
            r.ops as f64 / secs,
            r.bytes as f64 / secs / 1e6,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3
        );
    }
    Ok(if r.errors > 0 { 1 } else { 0 })
}
