"""The papers' claims that ``experiments.reproduce`` knows: what each says, the
paper's number, and the commands that reproduce it at CPU scale (run on this
project's 2-core machine) and at the paper's scale.

A claim's report (under docs/results/) names its command, machine and date in
its header and sums up our result in a ``- summary:`` line, which
``python -m experiments.reproduce --results`` collects into
docs/results/README.md.
"""

import dataclasses

DATA = "--data_dir=../shared/data"


@dataclasses.dataclass(frozen=True)
class Claim:
    name: str
    source: str             # paper, table or figure
    statement: str          # what the paper claims
    paper: str              # the paper's number(s)
    report: str = None      # docs/results/<report> (None: not run here)
    cpu: tuple = None       # argv after "python -m" at CPU scale (None: GPU only)
    cpu_scale: str = ""     # what the CPU scale is, against the paper's
    paper_scale: tuple = None   # argv after "python -m" at the paper's scale
    paper_time: str = ""    # expected time at the paper's scale (an estimate)
    # The report is assembled by hand from the command's own output (its
    # summary line too); re-running the claim does not rewrite it.
    manual_report: bool = False

    def command(self, scale):
        argv = self.cpu if scale == "cpu" else self.paper_scale
        return None if argv is None else "python -m " + " ".join(argv)


_ABLATION_CASES = ("--cases=original,scale05,exclusive0,shortcut_only6,conv1x1,dropout,"
                   "relu_before_addition,full_preactivation")
_ABLATIONS_CPU = ("experiments.resnet_ablations", DATA, "--depth=20", "--train_steps=800",
                  "--seeds=0,1,2", _ABLATION_CASES, "--run_dir=runs/reproduce/resnet_ablations",
                  "--report=resnet_ablations_20.md")


def _ablations_110(table):
    """The paper's scale of one table: ResNet-110, 5 seeds, its own report."""
    return ("experiments.resnet_ablations", DATA, "--depth=110", "--seeds=0,1,2,3,4",
            f"--tables={table}", "--run_dir=runs/reproduce/resnet_ablations_110",
            f"--report=resnet_ablations_110_table{table}.md")


# Estimates on paper (docs/results/README.md, "Expected times"): training
# FLOPs per image x images, at a sustained 2-10 TFLOP/s on one current GPU.
_GPU_110 = "about 12 PFLOP per run: 20 min - 1.7 h per run on one GPU (estimate)"

CLAIMS = (
    Claim("gradient_propagation", "He et al. 2016, Eqns. 5 and 8",
          "With identity shortcuts the gradient reaches every unit at least undiminished "
          "(Eqn. 5); a shortcut scaled by lambda < 1 shrinks it as lambda^(L-l) (Eqn. 8).",
          "no number (an analysis)", "gradient_propagation.md",
          ("experiments.signal_propagation", DATA),
          "the paper's ResNet-110 at initialisation, one batch of 64 CIFAR-10 images",
          ("experiments.signal_propagation", DATA), "minutes (runs here)"),
    Claim("shattered_gradients", "Balduzzi et al. 2017 (lecture notes)",
          "Gradients of deep plain nets look like white noise; residual nets keep them "
          "correlated.", "no number (an analysis)", "shattered_gradients.md",
          ("experiments.signal_propagation", DATA),
          "the notes' 1-D nets (200 units a layer), 3 seeds",
          ("experiments.signal_propagation", DATA), "minutes (runs here)"),
    Claim("he_table1", "He et al. 2016, Table 1",
          "Impeded shortcuts (constant scaling 0.5, exclusive gating at b_g = 0, a 1x1 "
          "convolution, dropout 0.5) train worse than identity; shortcut-only gating at b_g = "
          "-6 comes close to it.", "identity 6.61%; scaling 0.5 fail; exclusive b_g=0 fail; "
          "shortcut-only b_g=-6 6.91%; 1x1 conv 12.22%; dropout fail (ResNet-110)",
          "resnet_ablations_20.md", _ABLATIONS_CPU,
          "ResNet-20, 800 iterations (2 epochs) of the cifar recipe, 3 seeds, 6 of 11 cases",
          _ablations_110("1"), "11 cases x 5 seeds; " + _GPU_110),
    Claim("he_table2", "He et al. 2016, Table 2",
          "Full pre-activation (e) beats the original unit (a); ReLU before addition (c) is "
          "worse.", "(a) 6.61%, (c) 7.84%, (e) 6.37% (ResNet-110)",
          "resnet_ablations_20.md", _ABLATIONS_CPU,
          "ResNet-20, 800 iterations (2 epochs), 3 seeds, cases (a), (c), (e)",
          _ablations_110("2"), "5 cases x 5 seeds; " + _GPU_110),
    Claim("he_tables_schedule", "He et al. 2016, Tables 1 and 2 (a whole schedule)",
          "Constant scaling 0.5 and exclusive gating at b_g = 0 train worse than identity; "
          "full pre-activation (e) better, after the learning-rate drops.",
          "identity 6.61%; scaling 0.5 fail; exclusive b_g=0 fail; (e) 6.37% (ResNet-110)",
          "resnet_ablations_20_schedule.md",
          ("experiments.resnet_ablations", DATA, "--depth=20", "--train_steps=3120",
           "--seeds=0", "--cases=original,scale05,exclusive0,full_preactivation",
           "--run_dir=runs/reproduce/resnet_ablations_schedule",
           "--report=resnet_ablations_20_schedule.md"),
          "ResNet-20, the cifar recipe compressed to 3,120 iterations (8 epochs; lr /10 at "
          "1,560 and 2,340), 1 seed, 4 cases",
          _ablations_110("1"), "11 cases x 5 seeds; " + _GPU_110),
    Claim("he_gating_units", "He et al. 2016, Table 1 against Srivastava (2025)",
          "Exclusive gating (b_g = -6) trains worse than the identity shortcut; Srivastava "
          "(2025) argues this follows from the paper's design choices (e.g. the ReLU after "
          "the gated sum).", "exclusive b_g=-6 8.70% vs identity 6.61% (ResNet-110, "
          "original unit)", "resnet_gating_20.md",
          ("experiments.resnet_ablations", DATA, "--depth=20", "--train_steps=800",
           "--seeds=0,1,2", "--tables=gating", "--run_dir=runs/reproduce/resnet_ablations",
           "--report=resnet_gating_20.md"),
          "ResNet-20, 800 iterations (2 epochs), 3 seeds, gated and identity shortcuts in "
          "units (a), (c), (e)",
          ("experiments.resnet_ablations", DATA, "--depth=110", "--seeds=0,1,2,3,4",
           "--tables=gating", "--run_dir=runs/reproduce/resnet_ablations_110",
           "--report=resnet_gating_110.md"), "6 cases x 5 seeds; " + _GPU_110),
    Claim("he2015_resnet20", "He et al. 2015, Table 6 (the original ResNet-20)",
          "ResNet-20 (original units, option A) trained with the CIFAR recipe for 64k "
          "iterations reaches 8.75% test error on CIFAR-10.", "8.75%",
          "resnet20_cifar10_h200.md", None,
          "the whole schedule, 64,000 iterations at batch 128, 1 seed (on a GPU)",
          ("keras_identity_cli.train", "--backend=jax", "--dataset=cifar10", "--model=resnet",
           "--depth=20", DATA, "--model_dir=runs/reproduce/resnet20_cifar10"),
          "about 2 PFLOP: 7.5 min on one H200 (measured), about 10 h on 2 CPU cores at 230 images/s (estimate)",
          manual_report=True),
    Claim("he_table2_164", "He et al. 2016, Tables 2 and 3 (ResNet-164)",
          "Full pre-activation improves the bottleneck ResNet-164.",
          "original 5.93%, pre-activation 5.46%", None, None, "GPU only",
          ("keras_identity_cli.train", "--model=preact_resnet164", "--dataset=cifar10",
           DATA), "about 12 PFLOP: 20 min - 1.7 h on one GPU (estimate)"),
    Claim("he_table3_1001", "He et al. 2016, Table 3 / Table 4",
          "A 1001-layer pre-activation ResNet reaches 4.92% on CIFAR-10 (7.61% with "
          "original units).", "4.92% (4.89 ± 0.14)", None, None, "GPU only",
          ("keras_identity_cli.train", "--model=preact_resnet1001", "--dataset=cifar10",
           DATA, "--batch_size=64"),
          "about 73 PFLOP: 2-10 h on one GPU, or 41-124 min on a v5e chip (estimates)"),
    Claim("he_fig1_1001", "He et al. 2016, Fig. 1 and Sec. 4.2",
          "With the original unit (f = ReLU) a 1001-layer ResNet's training loss falls very "
          "slowly at the beginning of training; with full pre-activation (f = identity) it "
          "falls very quickly.", "a figure: curves over 64k iterations (final test errors "
          "7.61% and 4.92%)", "he_fig1_1001.md",
          ("experiments.he_fig1", DATA, "--iterations=300", "--seed_iterations=100",
           "--run_dir=runs/reproduce/he_fig1"),
          "ResNet-1001 both ways, the first 300 iterations at batch 64 (0.23% of the "
          "schedule), 250 test images a point, a second seed for 100 iterations",
          ("experiments.he_fig1", DATA, "--batch_size=128", "--iterations=0",
           "--seed_iterations=0", "--interval=400", "--chunk=64000", "--test_examples=0",
           "--run_dir=runs/reproduce/he_fig1_paper", "--report=he_fig1_1001_paper.md"),
          "2 runs x 73 PFLOP: 4-20 h on one GPU (estimate)"),
    Claim("veit_deletion", "Veit et al. 2016 (lecture notes)",
          "A residual network behaves like an ensemble of shallow paths: deleting one unit "
          "of a trained ResNet barely changes its error, the error grows smoothly with the "
          "units deleted, and deleting a layer of a plain network is fatal.",
          "no number in the notes (Veit et al.: single deletions barely change a trained "
          "ResNet-110's CIFAR-10 error; a VGG net falls to chance)", "veit_deletion_mnist.md",
          ("experiments.veit_deletion", DATA, "--weights=mnist", "--test_examples=2000",
           "--draws=3"),
          "the notes' MNIST ResNet (25 units, 117,802 parameters) trained to the end (its "
          "preset: 20 epochs) and its plain twin (its preset where one exists, else 480 "
          "iterations at batch 128), 2,000 test images, 3 draws of k units, 1 seed",
          ("experiments.veit_deletion", DATA, "--train_steps=9360", "--interval=468",
           "--test_examples=10000", "--draws=10", "--run_dir=runs/reproduce/veit_paper",
           "--report=veit_deletion_mnist_paper.md"),
          "2 nets x 20 epochs, about 1.3 PFLOP: 2-11 min on one GPU, about 9 h here "
          "(estimates)"),
    Claim("veit_deletion_cifar", "Veit et al. 2016, Figs. 3 and 5 (lecture notes)",
          "On CIFAR-10, deleting a single unit of a trained ResNet barely changes its test "
          "error, except for the units that downsample; the error grows smoothly with the "
          "units deleted.", "a figure: ResNet-110's single deletions near its error, the "
          "downsampling units above it", "veit_deletion_cifar10.md",
          ("experiments.veit_deletion_cifar", DATA),
          "the CIFAR-10 presets (ResNet-20, original and pre-activation: 9 units each, "
          "trained to the end on the JPEG copy), the 10,000 test images, 3 draws of k units",
          ("experiments.veit_deletion_cifar", DATA, "--draws=10",
           "--report=veit_deletion_cifar10_paper.md"),
          "the same study with 10 draws, on a ResNet-110 preset trained to the end on a GPU "
          "(experiments/device_presets.sh, registered as cifar10): " + _GPU_110),
    Claim("degradation", "He et al. 2015, Figs. 1, 4 and 6 (lecture notes)",
          "The degradation problem: a deeper plain net has the higher training error; its "
          "residual twin does not.", "CIFAR-10: plain-56 above plain-20 in training error "
          "throughout; ResNet-56 6.97% against ResNet-20 8.75% test error",
          "degradation_cifar10.md", ("experiments.degradation", DATA),
          "plain-20/56 and ResNet-20/56, the first 2,000 of 64k iterations of the cifar recipe "
          "at batch 128, 500 test images a point, 1 seed",
          ("experiments.degradation", DATA, "--iterations=64000", "--interval=400",
           "--test_examples=0", "--run_dir=runs/reproduce/degradation_paper",
           "--report=degradation_cifar10_paper.md"),
          "4 runs, about 16 PFLOP in all: 30 min - 2.3 h on one GPU (estimate)"),
    Claim("looks_linear", "Balduzzi et al. 2017, Fig. 6 (lecture notes)",
          "With CReLU and the looks-linear initialisation a feedforward net trains about as "
          "well as a ResNet at depths where feedforward ReLU nets fail.",
          "CIFAR-10, depths up to 198: ReLU nets worse with depth (below the 40% linear "
          "baseline at 198), looks-linear comparable to the ResNet",
          "looks_linear_mnist.md",
          ("experiments.looks_linear", DATA, "--iterations=2340", "--interval=78",
           "--test_examples=2000"),
          "MNIST convnets at depths 10 and 30 trained to the end of the recipe's schedule "
          "compressed to 2,340 iterations at batch 128 (5 epochs), 1 seed; the notes' 1-D "
          "nets at depth 50, 3 seeds",
          ("experiments.looks_linear", DATA, "--depths=10,50,98,198", "--iterations=14040",
           "--interval=468", "--test_examples=0", "--run_dir=runs/reproduce/looks_linear_paper",
           "--report=looks_linear_mnist_paper.md"),
          "12 runs of 30 epochs, about 21 PFLOP in all: 40 min - 3 h on one GPU "
          "(estimate)"),
    Claim("he_table5_imagenet", "He et al. 2016, Table 5",
          "Pre-activation ResNet-200 beats the original ResNet-200 on ImageNet.",
          "21.8% -> 20.7% top-1 (320x320 crop)", None, None,
          "ImageNet is not on this machine",
          ("keras_identity_cli.train", "--model=preact_resnet200_imagenet",
           "--dataset=imagenet", "--data_dir=<tfds dir with imagenet2012>", "--eval_crop=320"),
          "about 14 EFLOP: about 2 days on 8 GPUs (estimate)"),
    Claim("gate_bias_search", "He et al. 2016, Sec. 3.1; Srivastava et al. 2015, Sec. 2.2",
          "The initial gate bias is critical; negative values (He et al.: -6 best for "
          "exclusive gating) let gated nets train.", "b_g = -6 best (ResNet-110, 8.70%)",
          "tune_highway50_mnist.md",
          ("keras_identity_cli.tune", "--model=highway_net", "--depth=50", "--dataset=mnist",
           "--tuner=grid", "--epochs=3", "--retrain_best",
           "--model_dir=runs/tune_highway50"),
          "highway-50 on MNIST (not a ResNet-110 on CIFAR-10), 3 epochs per trial, 1 seed",
          ("keras_identity_cli.tune", "--model=resnet", "--depth=110",
           "--shortcut=exclusive_gating", "--dataset=cifar10", DATA, "--epochs=164",
           "--retrain_best"), "11 trials + 1 retraining of ResNet-110; " + _GPU_110,
          manual_report=True),
    Claim("highway_fig1_depth", "Srivastava et al. 2015, Fig. 1",
          "Plain nets get harder to optimise as they deepen; highway nets of 10-100 layers "
          "optimise well.", "10/20-layer plain: training loss < 1e-4; highway-100 more than "
          "100x below plain-100", "highway_depth_study_mnist.md",
          ("experiments.highway_depth_study", "--epochs=5"),
          "depths 10/20/50/100, 5 epochs, 3 learning rates per net (the paper: a 100-run "
          "random search per net, epochs not stated)",
          ("experiments.highway_depth_study", "--epochs=50"),
          "runs here in about 2 hours (50 epochs x 24 runs; the paper's length is not stated)"),
    Claim("highway_fig1_search", "Srivastava et al. 2015, Fig. 1 (100 layers)",
          "A random search over learning rate, momentum, decay, activation and b_T finds a "
          "100-layer highway net that optimises well; a 100-layer plain net does not.",
          "highway-100 more than 100x below plain-100 in training loss",
          "highway_fig1_search_mnist.md", ("experiments.highway_fig1_search",),
          "100 layers, 20 trials of 5 epochs per net (the paper: 100 trials), best retrained "
          "20 epochs", ("experiments.highway_fig1_search", "--trials=100", "--epochs=20",
                        "--retrain_epochs=100",
                        "--run_dir=runs/reproduce/highway_fig1_paper"),
          "runs here in about 12 hours (5x the trials, 4x the epochs of the CPU scale)"),
    Claim("highway_gates", "Srivastava et al. 2015, Figs. 2-4",
          "Transform-gate biases fall during training, gates are selective per example, and "
          "lesioning layers shows which ones the net relies on.",
          "no number (figures)", "highway_gates_mnist.md", ("experiments.highway_gates",),
          "the highway-50 preset (weights='mnist': the default first run, trained to the "
          "end, 20 epochs)",
          ("experiments.highway_gates",), "minutes (runs here)"),
    Claim("highway_table1", "Srivastava et al. 2015, Table 1",
          "10-layer convolutional highway nets reach 99.43% (width 16) and 99.55% (width "
          "32) on MNIST.", "99.43% (99.4 ± 0.03), 99.55% (99.54 ± 0.02)",
          "highway_table1_mnist.md", ("experiments.highway_table1", "--runs=3"),
          "the paper's: all of MNIST, 30 epochs, 3 runs a width (the paper: 5)",
          ("experiments.highway_table1", "--runs=5"),
          "runs here: about 15 min (width 16) and 35 min (width 32) a run"),
    Claim("highway_table2_cifar", "Srivastava et al. 2015, Table 2",
          "A 19-layer highway net trained in one stage matches Fitnet B on CIFAR-10.",
          "92.46% (92.28 ± 0.16)", None, None, "GPU only",
          ("keras_identity_cli.train", "--model=highway19_cifar10", "--dataset=cifar10",
           DATA), "about 18 PFLOP (1.76 GFLOP per training image x 200 epochs): 30 min - "
                  "2.4 h on one GPU (estimate)"),
)

BY_NAME = {claim.name: claim for claim in CLAIMS}
