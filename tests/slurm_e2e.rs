//! gpupin on a Slurm node, with a real Slurm: munged, slurmctld and slurmd from Debian
//! (slurm_support), gpupin's shipped prolog and epilog, batch jobs asking for GPUs with
//! `--gres`, and runc containers and `gpupin exec` jobs outside and inside them. Run by
//! .ci/run; each test starts and stops its own cluster in well under a minute.

#[allow(dead_code)]
mod exec_support;
mod slurm_support;

use exec_support::{Daemon, GPUPIN, User, open_up, scratch};
use gpupin_sandbox::harness::{self, Gpupin, Sandbox};
use serde_json::Value;
use slurm_support::{Cluster, GRES_MINORS, NODE};
use std::path::PathBuf;
use std::process::Output;

/// A batch job that writes its environment to the scratch dir, says it started, and
/// waits for its go (at most 90 s, so that a job a failed test left behind still ends).
struct BatchJob<'c> {
    cluster: &'c Cluster,
    id: u32,
    scratch: PathBuf,
}

impl<'c> BatchJob<'c> {
    fn submit(cluster: &'c Cluster, g: &Gpupin, user: Option<&User>, gres: &str) -> Self {
        let scratch = scratch(g);
        let script = scratch.join(format!(
            "job-{gres}-{}.sh",
            user.map_or("root", |u| &u.name)
        ));
        let text = format!(
            "#!/bin/sh\ns={scratch:?}\nenv > \"$s/$SLURM_JOB_ID.env\"\ntouch \"$s/$SLURM_JOB_ID.started\"\n\
             i=0\nwhile [ ! -e \"$s/$SLURM_JOB_ID.done\" ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done\n",
            scratch = scratch.display().to_string()
        );
        std::fs::write(&script, text).unwrap();
        let exec = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&script, exec).unwrap();
        let id = cluster.sbatch(user.map(|u| (u.uid, u.gid)), gres, &script);
        BatchJob {
            cluster,
            id,
            scratch,
        }
    }

    fn file(&self, what: &str) -> PathBuf {
        self.scratch.join(format!("{}.{what}", self.id))
    }

    fn holder(&self) -> String {
        format!("slurm-{}", self.id)
    }

    /// Waits until the job runs; its environment.
    fn started(&self) -> Vec<(String, String)> {
        self.cluster.until(&format!("job {} runs", self.id), || {
            self.file("started").exists().then_some(())
        });
        let env = std::fs::read_to_string(self.file("env")).unwrap();
        env.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn finish(&self) {
        std::fs::write(self.file("done"), "").unwrap();
    }

    /// `srun --jobid ID --overlap ARGS`: a step inside the job, as root or `user`.
    fn step(&self, user: Option<&User>, args: &[&str]) -> Output {
        let id = self.id.to_string();
        let mut full = vec!["--jobid", &id, "--overlap"];
        full.extend_from_slice(args);
        self.cluster
            .run(user.map(|u| (u.uid, u.gid)), "srun", &full)
    }
}

impl Drop for BatchJob<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Kills a runc container (if it still runs) when dropped.
struct KillOnDrop<'r>(&'r gpupin_sandbox::Runc, &'r str);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        if self.0.exists(self.1) {
            let _ = self.0.kill(self.1, "KILL");
        }
    }
}

fn var<'e>(env: &'e [(String, String)], name: &str) -> &'e str {
    env.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{name} is not in the job's environment: {env:?}"))
}

/// Slurm's GPU numbers (`SLURM_JOB_GPUS`) as the device minors gres.conf gives them.
fn minors_of(slurm_gpus: &str) -> Vec<u32> {
    let mut minors: Vec<u32> = slurm_gpus
        .split(',')
        .map(|n| GRES_MINORS[n.parse::<usize>().unwrap()])
        .collect();
    minors.sort();
    minors
}

/// The index of the GPU with device minor `minor`.
fn index_of(st: &Value, minor: u32) -> u64 {
    st["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["minor"] == minor)
        .expect("the minor is in the inventory")["index"]
        .as_u64()
        .unwrap()
}

/// Device minors of `indices` (CUDA_VISIBLE_DEVICES), sorted.
fn minors_at(st: &Value, indices: &str) -> Vec<u32> {
    let mut minors: Vec<u32> = indices
        .trim()
        .split(',')
        .map(|i| {
            let i: u64 = i.parse().unwrap();
            let gpu = st["gpus"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["index"] == i);
            gpu.expect("index in inventory")["minor"].as_u64().unwrap() as u32
        })
        .collect();
    minors.sort();
    minors
}

/// What an admin sees when the prolog refuses `job`: the node drained with `Prolog
/// error`, the job requeued held, never started; and slurmd's log line of the failure.
fn prolog_failure(cluster: &Cluster, job: &BatchJob) -> String {
    let node = cluster.until("the prolog's refusal drains the node", || {
        let node = cluster.show("node", NODE);
        node.contains("DRAIN").then_some(node)
    });
    assert!(node.contains("Reason=Prolog error"), "{node}");
    let state = cluster.show("job", &job.id.to_string());
    assert!(
        state.contains("Reason=launch_failed_requeued_held"),
        "{state}"
    );
    assert!(!job.file("started").exists(), "the job never ran");
    let log = cluster.slurmd_log();
    log.lines()
        .find(|l| l.contains("prolog failed"))
        .unwrap_or_else(|| panic!("no prolog failure in slurmd's log:\n{log}"))
        .to_string()
}

fn until_released(cluster: &Cluster, g: &Gpupin, holder: &str) {
    cluster.until(&format!("the epilog releases {holder}"), || {
        g.holder(holder).is_none().then_some(())
    });
}

/// The dynamic way: Slurm knows GPUs 6, 2, 3 and 7 (in that order), gpupin hands out
/// all eight, and the prolog's hold is what keeps containers started outside Slurm off
/// a job's GPUs while it runs.
#[test]
fn a_jobs_gpus_are_held_while_it_runs_and_containers_inside_it_get_them() {
    let test = "a_jobs_gpus_are_held_while_it_runs";
    if !slurm_support::requirements(test) {
        return;
    }
    let Some(sb) = Sandbox::with_config(GPUPIN, test, "sim:nvswitch8", "slurm_containers = true")
    else {
        return;
    };
    open_up(&sb.gpupin);
    let g = &sb.gpupin;
    let cluster = Cluster::start(g, &[]);

    let job = BatchJob::submit(&cluster, g, None, "gpu:2");
    let env = job.started();
    // What Slurm told the job: its numbers for the GPUs, not their device minors.
    let slurm_gpus = var(&env, "SLURM_JOB_GPUS").to_string();
    assert_eq!(var(&env, "CUDA_VISIBLE_DEVICES"), slurm_gpus);
    let job_minors = minors_of(&slurm_gpus);
    assert_eq!(
        g.held_minors(&job.holder()),
        job_minors,
        "the prolog holds SLURM_JOB_GPUS={slurm_gpus} by gres.conf's File= order"
    );
    let hold = g.holder(&job.holder()).unwrap();
    assert_eq!(hold["owner"]["user"], "root", "{hold}");

    // A container started outside the job is kept off the job's GPUs: it gets the other
    // six, and naming one of the job's is refused in one line that names the job.
    let outside = sb
        .start(
            &sb.id("outside"),
            &sb.spec().annotation("gpupin.count", "6"),
        )
        .unwrap();
    let outside_minors = g.held_minors(outside.id());
    assert_eq!(outside_minors.len(), 6);
    assert!(
        outside_minors.iter().all(|m| !job_minors.contains(m)),
        "outside {outside_minors:?}, job {job_minors:?}"
    );
    let st = g.status();
    let one_of_the_jobs = index_of(&st, job_minors[0]).to_string();
    let err = sb
        .start(
            &sb.id("named"),
            &sb.spec().annotation("gpupin.devices", &one_of_the_jobs),
        )
        .unwrap_err()
        .to_string();
    let refusal = gpupin_sandbox::hook_message(&err).unwrap_or(err.clone());
    assert!(refusal.contains(&job.holder()), "{refusal}");

    // A container that names the job (SLURM_JOB_ID, as an image's ENV could) without
    // its key gets nothing.
    let bare = sb
        .spec()
        .env("GPUPIN_COUNT", "1")
        .env("SLURM_JOB_ID", &job.id.to_string());
    let err = sb.start(&sb.id("bare"), &bare).unwrap_err().to_string();
    let refusal = gpupin_sandbox::hook_message(&err).unwrap_or(err.clone());
    assert!(
        refusal.contains(&format!("taking GPUs from {} needs its key", job.holder())),
        "{refusal}"
    );

    // A container started inside the job (by a step, passing on the job's SLURM_JOB_ID
    // and the GPUPIN_WITHIN the TaskProlog put in its env, as `docker run -e` does)
    // takes from the job's hold: every other GPU is held.
    let inside_id = sb.id("inside");
    let bundle = sb.bundle_dir(&inside_id);
    let spec = sb
        .spec()
        .env("GPUPIN_COUNT", "1")
        .env("SLURM_JOB_ID", "@SLURM_JOB_ID@")
        .env("GPUPIN_WITHIN", "@GPUPIN_WITHIN@");
    gpupin_sandbox::write_bundle(&bundle, &spec).unwrap();
    let config = bundle.join("config.json");
    let start_inside = format!(
        "sed -i \"s/@SLURM_JOB_ID@/$SLURM_JOB_ID/; s/@GPUPIN_WITHIN@/$GPUPIN_WITHIN/\" {config:?} && exec {runc:?} --root {root:?} run --bundle {bundle:?} {inside_id}",
        config = config.display().to_string(),
        runc = sb.runc.binary.display().to_string(),
        root = sb.runc.root.display().to_string(),
        bundle = bundle.display().to_string(),
    );
    std::thread::scope(|s| {
        // On a failed assertion the step must end before the scope can: kill the
        // container, and with it `runc run`.
        let _stop = KillOnDrop(&sb.runc, &inside_id);
        let step = s.spawn(|| job.step(None, &["sh", "-c", &start_inside]));
        // Running, not only recorded: the record is written in the prestart hook, before
        // the hook has made the container's nodes.
        let running = || {
            sb.runc
                .state(&inside_id)
                .is_ok_and(|st| st.status == "running")
        };
        let started = cluster.until("the container inside the job runs", || {
            match step.is_finished() {
                true => Some(false),
                false => running().then_some(true),
            }
        });
        if !started {
            let out = step.join().unwrap();
            panic!("the step ended: {}", harness::stderr(&out));
        }
        let inside_minors = g.held_minors(&inside_id);
        assert_eq!(inside_minors.len(), 1);
        assert!(job_minors.contains(&inside_minors[0]), "{inside_minors:?}");
        let record = g.holder(&inside_id).unwrap();
        assert_eq!(record["request"]["within"], job.holder(), "{record}");
        let dev = sb.runc.exec(&inside_id, &["ls", "/dev"]).unwrap();
        let nodes = harness::gpu_nodes(harness::stdout(&dev).lines());
        assert_eq!(nodes, [format!("nvidia{}", inside_minors[0])]);

        // gpupin exec inside the job, asking for nothing in particular, gets the rest
        // of the job's GPUs.
        let cfg = g.config.display().to_string();
        let bin = g.bin.display().to_string();
        let out = job.step(
            None,
            &[
                &bin,
                "--config",
                &cfg,
                "exec",
                "--",
                "sh",
                "-c",
                "echo $CUDA_VISIBLE_DEVICES",
            ],
        );
        assert!(out.status.success(), "{}", harness::stderr(&out));
        let exec_minors = minors_at(&g.status(), &harness::stdout(&out));
        let rest: Vec<u32> = job_minors
            .iter()
            .copied()
            .filter(|m| *m != inside_minors[0])
            .collect();
        assert_eq!(exec_minors, rest);

        sb.runc.kill(&inside_id, "KILL").unwrap();
        let out = step.join().unwrap();
        assert!(
            !out.status.success(),
            "runc run ends with its killed container"
        );
    });
    assert!(g.holder(&inside_id).is_none(), "poststop released it");

    job.finish();
    until_released(&cluster, g, &job.holder());
    assert_eq!(g.held_minors(outside.id()), outside_minors);

    // Slurm does not see gpupin's holders: the container outside holds two GPUs Slurm
    // thinks are free. A job given one of them fails its prolog, and Slurm keeps the job
    // off the node and drains it, instead of running two users on one GPU.
    let clash = BatchJob::submit(&cluster, g, None, "gpu:4");
    // slurmd logs the prolog's output: gpupin's one line, naming the holder in the way.
    let failed = prolog_failure(&cluster, &clash);
    assert!(
        failed.contains("output:gpupin: cannot allocate")
            && failed.contains(&format!(
                "for {}: it is held by {}",
                clash.holder(),
                outside.id()
            )),
        "{failed}"
    );
    assert!(g.holder(&clash.holder()).is_none());
    drop(outside);
}

/// The static split, with a user's job: Slurm's four GPUs sit in a standing hold
/// (`slurm-pool`), each job's hold is taken from it, and `gpupin exec` outside Slurm
/// only ever gets the other four. Inside the job its user's `gpupin exec` (through
/// `gpupin serve`) takes the job's GPUs; another user naming the job is refused.
#[test]
fn with_a_standing_pool_users_jobs_nest_in_it_and_exec_outside_never_gets_slurms_gpus() {
    let test = "with_a_standing_pool_users_jobs_nest_in_it";
    if !slurm_support::requirements(test) || !exec_support::requirements(test) {
        return;
    }
    let g = exec_support::gpupin("");
    let alice = User::create("sla");
    let bob = User::create("slb");
    let _daemon = Daemon::start(&g);
    let pool: Vec<String> = GRES_MINORS.iter().map(u32::to_string).collect();
    exec_support::ok(
        &g,
        None,
        &[
            "hold",
            "slurm-pool",
            "--devices",
            &pool.join(","),
            "--by-minor",
            "--until-release",
        ],
    );
    let cluster = Cluster::start(&g, &[("GPUPIN_SLURM_POOL", "slurm-pool")]);

    // Outside Slurm, only the four GPUs Slurm does not have, busy or not.
    let out = exec_support::ok(
        &g,
        None,
        &[
            "exec",
            "--count",
            "4",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
    );
    assert_eq!(minors_at(&g.status(), &out), [0, 1, 4, 5]);
    let refusal = exec_support::refused(&g, None, &["exec", "--count", "5", "--", "true"]);
    assert!(refusal.contains("cannot allocate 5 GPUs"), "{refusal}");

    let job = BatchJob::submit(&cluster, &g, Some(&alice), "gpu:2");
    let env = job.started();
    let job_minors = minors_of(var(&env, "SLURM_JOB_GPUS"));
    assert_eq!(g.held_minors(&job.holder()), job_minors);
    let hold = g.holder(&job.holder()).unwrap();
    assert_eq!(hold["owner"]["user"], alice.name.as_str(), "{hold}");
    assert_eq!(hold["request"]["within"], "slurm-pool", "{hold}");
    // The TaskProlog gave the job its hold's key (through gpupin serve, as alice): the
    // way into the job's GPUs for a container she starts with GPUPIN_WITHIN.
    let key = exec_support::ok(&g, None, &["key", &job.holder()]);
    assert_eq!(var(&env, "GPUPIN_WITHIN"), key.trim());

    // alice's own step: her gpupin exec asks the daemon, which checks that the job's
    // hold is hers.
    let (cfg, bin) = (g.config.display().to_string(), g.bin.display().to_string());
    let out = job.step(
        Some(&alice),
        &[
            &bin,
            "--config",
            &cfg,
            "exec",
            "--count",
            "1",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
    );
    assert!(out.status.success(), "{}", harness::stderr(&out));
    let got = minors_at(&g.status(), &harness::stdout(&out));
    assert!(got.len() == 1 && job_minors.contains(&got[0]), "{got:?}");

    // bob claims to be in alice's job: the daemon refuses, naming whose hold it is.
    let mut cmd = exec_support::cmd(&g, Some(&bob), &["exec", "--count", "1", "--", "true"]);
    let out = cmd
        .env("SLURM_JOB_ID", job.id.to_string())
        .output()
        .unwrap();
    let refusal = exec_support::refusal(&out, "bob naming alice's job");
    assert!(
        refusal.contains(&format!(
            "gpupin.within={} is {}'s",
            job.holder(),
            alice.name
        )),
        "{refusal}"
    );

    job.finish();
    until_released(&cluster, &g, &job.holder());
    assert_eq!(
        g.held_minors("slurm-pool"),
        {
            let mut p = GRES_MINORS.to_vec();
            p.sort();
            p
        },
        "the pool stays"
    );
}

/// A drained GPU is refused to the prolog's hold as a held one is: with all four of
/// Slurm's GPUs drained, a job given one fails its prolog with the drain's line, and
/// Slurm keeps the job off the node and drains the node. After `gpupin undrain`, a resume
/// and a release, the same job runs with its GPUs held.
#[test]
fn a_drained_gpu_slurm_gives_a_job_fails_its_prolog_with_the_drains_line() {
    let test = "a_drained_gpu_slurm_gives_a_job_fails_its_prolog";
    if !slurm_support::requirements(test) {
        return;
    }
    let g = exec_support::gpupin("");
    let cluster = Cluster::start(&g, &[]);
    let st = g.status();
    let drained: Vec<String> = GRES_MINORS
        .iter()
        .map(|m| index_of(&st, *m).to_string())
        .collect();
    let mut args = vec!["drain"];
    args.extend(drained.iter().map(String::as_str));
    args.extend(["--reason", "fan swap, ticket 4411"]);
    exec_support::ok(&g, None, &args);

    let job = BatchJob::submit(&cluster, &g, None, "gpu:1");
    // slurmd logs the prolog's output: gpupin's one line, naming the drain.
    let failed = prolog_failure(&cluster, &job);
    let gpu = failed
        .split_once("output:gpupin: cannot allocate GPU ")
        .and_then(|(_, rest)| rest.split_once(' '))
        .map(|(gpu, _)| gpu)
        .unwrap_or_else(|| panic!("{failed}"));
    assert!(drained.iter().any(|d| d == gpu), "{failed}");
    let uuid = harness::status::uuid_of(&st, gpu.parse().unwrap());
    assert!(
        failed.ends_with(&format!(
            "error: prolog failed: rc:1 output:gpupin: cannot allocate GPU {gpu} ({uuid}) for {}: it is drained by root: fan swap, ticket 4411; it comes back with gpupin undrain {gpu}",
            job.holder()
        )),
        "{failed}"
    );
    assert!(g.holder(&job.holder()).is_none());

    // Undrain, resume the node, release the job. Slurm makes a requeued job eligible only
    // two minutes later (Reason=BeginTime): starttime=now lets it run at once.
    let mut args = vec!["undrain"];
    args.extend(drained.iter().map(String::as_str));
    exec_support::ok(&g, None, &args);
    let (nodename, id) = (format!("nodename={NODE}"), job.id.to_string());
    let jobid = format!("jobid={id}");
    for args in [
        &["update", &nodename, "state=resume"][..],
        &["release", &id],
        &["update", &jobid, "starttime=now"],
    ] {
        let out = cluster.run(None, "scontrol", args);
        assert!(
            out.status.success(),
            "scontrol {args:?}: {}",
            harness::stderr(&out)
        );
    }
    let env = job.started();
    assert_eq!(
        g.held_minors(&job.holder()),
        minors_of(var(&env, "SLURM_JOB_GPUS"))
    );
    job.finish();
    until_released(&cluster, &g, &job.holder());
}
