//! The test-only faults the harness can inject, over every engine that has them: Falcon's
//! [`Fault`] (the Falcon-layout engines) and Zen's [`ZenFault`]. One command-line name space
//! (`--inject-fault NAME`, `--list-faults`); a fault given for an engine it does not apply to is
//! refused with an error naming the engines it does apply to.

use crate::db::DbConfig;
use crate::engine::dudetx::DudetxFault;
use crate::engine::falcon::Fault;
use crate::engine::fir::FirFault;
use crate::engine::mmdb::MmdbFault;
use crate::engine::zen::ZenFault;
use crate::engine::EngineKind;
use crate::pmem::PersistenceDomain;
use serde::Serialize;

/// A deliberate engine bug, for showing that the harness catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum InjectedFault {
    /// A Falcon fault (falcon, falcon-allflush, falcon-noflush, inp: `DbConfig::fault`).
    Falcon(Fault),
    /// A Zen fault (`DbConfig::zen_fault`).
    Zen(ZenFault),
    /// A FIR fault (`DbConfig::fir_fault`).
    Fir(FirFault),
    /// A DUDETx fault (`DbConfig::dudetx_fault`).
    Dudetx(DudetxFault),
    /// An MMDB fault (`DbConfig::mmdb_fault`).
    Mmdb(MmdbFault),
}

/// The engines Falcon's data-flush faults apply to: every Falcon-code engine, `wbl` (last)
/// included, which flushes its new versions at commit with the same code but has no log window.
const FALCON_DATA_ENGINES: &[EngineKind] = &[
    EngineKind::Falcon,
    EngineKind::FalconAllflush,
    EngineKind::FalconNoflush,
    EngineKind::Inp,
    EngineKind::Outp,
    EngineKind::Wbl,
];

/// The engines Falcon's other faults apply to (they share Falcon's commit code and its log).
const FALCON_ENGINES: &[EngineKind] = FALCON_DATA_ENGINES.split_at(5).0;

impl InjectedFault {
    /// Every fault of every engine, Falcon's first.
    pub fn all() -> Vec<InjectedFault> {
        Fault::ALL
            .into_iter()
            .map(InjectedFault::Falcon)
            .chain(ZenFault::ALL.into_iter().map(InjectedFault::Zen))
            .chain(FirFault::ALL.into_iter().map(InjectedFault::Fir))
            .chain(DudetxFault::ALL.into_iter().map(InjectedFault::Dudetx))
            .chain(MmdbFault::ALL.into_iter().map(InjectedFault::Mmdb))
            .collect()
    }

    /// The faults that apply to `engine`.
    pub fn for_engine(engine: EngineKind) -> Vec<InjectedFault> {
        InjectedFault::all()
            .into_iter()
            .filter(|f| f.applies_to(engine))
            .collect()
    }

    /// The command-line name (unique over all engines).
    pub fn name(self) -> &'static str {
        match self {
            InjectedFault::Falcon(f) => f.name(),
            InjectedFault::Zen(f) => f.name(),
            InjectedFault::Fir(f) => f.name(),
            InjectedFault::Dudetx(f) => f.name(),
            InjectedFault::Mmdb(f) => f.name(),
        }
    }

    /// What the fault breaks.
    pub fn describe(self) -> &'static str {
        match self {
            InjectedFault::Falcon(f) => f.describe(),
            InjectedFault::Zen(f) => f.describe(),
            InjectedFault::Fir(f) => f.describe(),
            InjectedFault::Dudetx(f) => f.describe(),
            InjectedFault::Mmdb(f) => f.describe(),
        }
    }

    /// The engines the fault applies to.
    pub fn engines(self) -> &'static [EngineKind] {
        match self {
            // An ordering step only the out-of-place variant has.
            InjectedFault::Falcon(Fault::OutpKeepOldLive) => &[EngineKind::Outp],
            InjectedFault::Falcon(
                Fault::WblSkipTidFence | Fault::WblAckBeforeCp | Fault::WblFreeBeforeCp,
            ) => &[EngineKind::Wbl],
            // Shown by the drop crash test (`crashtest::drop`), not by the workloads.
            InjectedFault::Falcon(Fault::DropFreeBeforeTombstone) => &[EngineKind::Falcon],
            // Steps of PM secondary indexes, which the crash suite runs on falcon (`--index pm`,
            // workload `secondary`).
            InjectedFault::Falcon(Fault::SecondarySkipOldLog | Fault::SecondaryRemoveBeforeLog) => {
                &[EngineKind::Falcon]
            }
            InjectedFault::Falcon(Fault::SkipDataFlush | Fault::SkipDataFence) => {
                FALCON_DATA_ENGINES
            }
            InjectedFault::Falcon(_) => FALCON_ENGINES,
            InjectedFault::Zen(_) => &[EngineKind::Zen],
            InjectedFault::Fir(_) => &[EngineKind::Fir],
            InjectedFault::Dudetx(_) => &[EngineKind::Dudetx],
            InjectedFault::Mmdb(_) => &[EngineKind::Mmdb],
        }
    }

    /// Whether the fault is a step of a table drop's order, which the crash workloads never
    /// run: the drop crash test ([`crate::crashtest::drop`]) shows it instead.
    pub fn is_drop_step(self) -> bool {
        matches!(
            self,
            InjectedFault::Falcon(Fault::DropFreeBeforeTombstone)
                | InjectedFault::Zen(ZenFault::DropSkipWatermark)
                | InjectedFault::Fir(FirFault::DropFreeBeforeTombstone)
        )
    }

    /// Whether the fault applies to `engine`.
    pub fn applies_to(self, engine: EngineKind) -> bool {
        self.engines().contains(&engine)
    }

    /// `Err` with a clear message when the fault does not apply to `engine`.
    pub fn check(self, engine: EngineKind) -> Result<(), String> {
        if self.applies_to(engine) {
            return Ok(());
        }
        let engines: Vec<&str> = self.engines().iter().map(|e| e.name()).collect();
        let own: Vec<&str> = InjectedFault::for_engine(engine)
            .into_iter()
            .map(InjectedFault::name)
            .collect();
        Err(format!(
            "fault {self} applies to {} only, not to {engine} ({})",
            engines.join(", "),
            if own.is_empty() {
                format!("{engine} has no injectable faults")
            } else {
                format!("its faults: {}", own.join(", "))
            }
        ))
    }

    /// Whether the fault only removes a flush or a fence that orders ordinary stores. Under eADR
    /// the caches are in the persistence domain and x86 stores become durable in program order,
    /// so such a fault changes nothing there (measured: 0 violations in 300 images of bank and of
    /// TPC-C for each). Zen's `skip-fence` is not one: its tuples are non-temporal stores, which
    /// wait in write-combining buffers for the `sfence` under eADR too. `commit-mark-first`
    /// reorders stores, which eADR does not hide.
    pub fn only_removes_ordinary_flushes(self) -> bool {
        match self {
            // `outp-keep-old-live` drops a store, not a flush.
            // `wbl-ack-before-cp` and `wbl-free-before-cp` break the logic, not a flush.
            InjectedFault::Falcon(f) => !matches!(
                f,
                Fault::CommitMarkFirst
                    | Fault::OutpKeepOldLive
                    | Fault::WblAckBeforeCp
                    | Fault::WblFreeBeforeCp
                    | Fault::DropFreeBeforeTombstone
                    | Fault::SecondarySkipOldLog
                    | Fault::SecondaryRemoveBeforeLog
            ),
            // A drop without its watermark loses commit evidence under eADR too.
            InjectedFault::Zen(f) => {
                !matches!(f, ZenFault::SkipFence | ZenFault::DropSkipWatermark)
            }
            // FIR's `fir-lctt-first` stores the commit point before the contents, and the two
            // checkpoint faults break the order of stores or the logic, not a flush.
            InjectedFault::Fir(f) => matches!(
                f,
                FirFault::SkipTupleFlush
                    | FirFault::SkipTupleFence
                    | FirFault::SkipLcttFlush
                    | FirFault::CheckpointSkipDirectoryFlush
            ),
            InjectedFault::Dudetx(f) => f.only_removes_ordinary_flushes(),
            InjectedFault::Mmdb(f) => f.only_removes_ordinary_flushes(),
        }
    }

    /// `Err` with a clear message when the fault does not apply to `engine`, or cannot break it
    /// under `domain` (a harness that accepted it would report "0 violations" for a bug it never
    /// ran).
    pub fn check_under(self, engine: EngineKind, domain: PersistenceDomain) -> Result<(), String> {
        self.check(engine)?;
        if domain == PersistenceDomain::Eadr && self.only_removes_ordinary_flushes() {
            let usable: Vec<&str> = InjectedFault::for_engine(engine)
                .into_iter()
                .filter(|f| !f.only_removes_ordinary_flushes())
                .map(InjectedFault::name)
                .collect();
            let adr = super::supported(engine, PersistenceDomain::Adr, engine.default_protocol());
            let instead = match (adr.is_ok(), usable.is_empty()) {
                (true, _) => "test it under adr".to_string(),
                (false, true) => format!("{engine} runs only under eadr"),
                (false, false) => format!(
                    "{engine} runs only under eadr, where its faults are: {}",
                    usable.join(", ")
                ),
            };
            return Err(format!(
                "fault {self} removes a flush or fence of ordinary stores, which eadr does not need \
                 (the caches are in the persistence domain): it cannot break {engine} under eadr; \
                 {instead}"
            ));
        }
        Ok(())
    }

    /// Turns the fault on in `config` (the engine's own knob).
    pub fn apply(self, config: &mut DbConfig) {
        match self {
            InjectedFault::Falcon(f) => config.fault = Some(f),
            InjectedFault::Zen(f) => config.zen_fault = Some(f),
            InjectedFault::Fir(f) => config.fir_fault = Some(f),
            InjectedFault::Dudetx(f) => config.dudetx_fault = Some(f),
            InjectedFault::Mmdb(f) => config.mmdb_fault = Some(f),
        }
    }
}

impl From<Fault> for InjectedFault {
    fn from(f: Fault) -> Self {
        InjectedFault::Falcon(f)
    }
}

impl From<ZenFault> for InjectedFault {
    fn from(f: ZenFault) -> Self {
        InjectedFault::Zen(f)
    }
}

impl From<FirFault> for InjectedFault {
    fn from(f: FirFault) -> Self {
        InjectedFault::Fir(f)
    }
}

impl From<DudetxFault> for InjectedFault {
    fn from(f: DudetxFault) -> Self {
        InjectedFault::Dudetx(f)
    }
}

impl From<MmdbFault> for InjectedFault {
    fn from(f: MmdbFault) -> Self {
        InjectedFault::Mmdb(f)
    }
}

impl std::fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for InjectedFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        InjectedFault::all()
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = InjectedFault::all()
                    .into_iter()
                    .map(InjectedFault::name)
                    .collect();
                format!(
                    "unknown fault '{s}' (expected one of: {}; see --list-faults)",
                    names.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        let all = InjectedFault::all();
        assert_eq!(
            all.len(),
            Fault::ALL.len()
                + ZenFault::ALL.len()
                + FirFault::ALL.len()
                + DudetxFault::ALL.len()
                + MmdbFault::ALL.len()
        );
        let mut names: Vec<&str> = all.iter().map(|f| f.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len(), "fault names collide: {names:?}");
        for f in all {
            assert_eq!(f.to_string().parse::<InjectedFault>(), Ok(f));
        }
        let err = "skip-everything".parse::<InjectedFault>().unwrap_err();
        assert!(
            err.contains("skip-fence") && err.contains("skip-log-flush"),
            "{err}"
        );
    }

    #[test]
    fn a_fault_that_only_removes_flushes_is_refused_under_eadr() {
        use PersistenceDomain::{Adr, Eadr};
        for f in InjectedFault::all() {
            for &engine in f.engines() {
                assert!(f.check_under(engine, Adr).is_ok(), "{f} {engine}");
            }
        }
        let err = InjectedFault::from(Fault::SkipLogFlush)
            .check_under(EngineKind::FalconNoflush, Eadr)
            .unwrap_err();
        assert!(
            err.contains("cannot break falcon-noflush under eadr"),
            "{err}"
        );
        assert!(
            err.contains("where its faults are: commit-mark-first"),
            "{err}"
        );
        let err = InjectedFault::from(Fault::SkipLogFlush)
            .check_under(EngineKind::Falcon, Eadr)
            .unwrap_err();
        assert!(err.ends_with("test it under adr"), "{err}");
        let ok = |f: InjectedFault, e| f.check_under(e, Eadr).is_ok();
        assert!(ok(Fault::CommitMarkFirst.into(), EngineKind::Inp));
        assert!(ok(ZenFault::SkipFence.into(), EngineKind::Zen));
        assert!(!ok(ZenFault::SkipCommitFence.into(), EngineKind::Zen));
        assert!(!ok(Fault::SkipDataFence.into(), EngineKind::Falcon));
    }

    #[test]
    fn a_fault_of_another_engine_is_refused() {
        let zen: InjectedFault = "skip-fence".parse().unwrap();
        assert_eq!(zen, InjectedFault::Zen(ZenFault::SkipFence));
        assert!(zen.check(EngineKind::Zen).is_ok());
        let err = zen.check(EngineKind::Falcon).unwrap_err();
        assert!(err.contains("applies to zen only"), "{err}");
        assert!(err.contains("skip-data-flush"), "{err}");
        let falcon: InjectedFault = "skip-data-flush".parse().unwrap();
        assert!(falcon.check(EngineKind::Inp).is_ok());
        let err = falcon.check(EngineKind::Zen).unwrap_err();
        assert!(
            err.contains("not to zen") && err.contains("skip-tuple-flush"),
            "{err}"
        );
        let err = falcon.check(EngineKind::Volatile).unwrap_err();
        assert!(err.contains("volatile has no injectable faults"), "{err}");
    }

    #[test]
    fn apply_sets_the_engines_own_knob() {
        let mut c = DbConfig::temporary();
        InjectedFault::Zen(ZenFault::SkipTupleFlush).apply(&mut c);
        assert_eq!(c.zen_fault, Some(ZenFault::SkipTupleFlush));
        assert_eq!(c.fault, None);
        let mut c = DbConfig::temporary();
        InjectedFault::Falcon(Fault::SkipLogFence).apply(&mut c);
        assert_eq!(c.fault, Some(Fault::SkipLogFence));
        assert_eq!(c.zen_fault, None);
    }
}
