"""Composed recipes from Python (coload.vision.transforms): equal to the presets, each op
family's parameters reaching C++, Python callables as user ops, the shard pipeline, and the
builder's errors."""
import io
import tarfile

import pytest
import torch

import coload
from coload.vision import transforms as T
from test_native import make_folder

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    make_folder(root)  # 3 classes x 4 generated JPEGs, about 410 x 468
    return root


def batches(root, recipe, seed=5, batch_size=6, train=True, **kwargs):
    ds = coload.vision.ImageFolder(root, recipe=recipe, train=train)
    return list(coload.DataLoader(ds, batch_size=batch_size, seed=seed, **kwargs))


def same(a, b):
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def base(root, *ops, **kwargs):
    """A deterministic 64 x 64 centre crop of each image, as floats in [0, 1], then `ops`."""
    return batches(root, T.Compose([T.CenterCrop(64), *ops]), batch_size=12, **kwargs)[0]


# ---- Equal to the presets --------------------------------------------------------------------

def test_classic_composed_equals_preset(folder):
    composed = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                          T.Normalize(MEAN, STD)])
    a, b = batches(folder, composed), batches(folder, "classic")
    assert len(a) == 2 and same(a, b)
    assert not same(a, batches(folder, composed, seed=6))  # the seed reaches the draws
    evaluation = coload.vision.Recipe([T.Resize(256), T.CenterCrop(224), T.ToImage(),
                                       T.ToTensor(), T.Normalize(MEAN, STD)])
    assert same(batches(folder, evaluation), batches(folder, "classic", train=False))


def test_resnet50_composed_equals_preset(folder):
    def composed_with(interpolation):
        return T.Compose([
            T.RandomResizedCrop(176), T.RandomHorizontalFlip(),
            T.TrivialAugmentWide(interpolation=interpolation),
            T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD), T.RandomErasing(0.1),
            T.RandomChoice([T.MixUp(alpha=0.2), T.CutMix(alpha=1.0)])])
    # Bilinear, as torchvision's train.py passes its --interpolation to TrivialAugmentWide.
    composed = composed_with("bilinear")
    a = batches(folder, composed, num_workers=2)
    b = batches(folder, "resnet50", num_workers=2)
    assert same(a, b)
    # Seed 7 draws geometric ops, where the interpolation shows (seed 5's draw none).
    preset = batches(folder, "resnet50", seed=7)
    assert same(batches(folder, composed, seed=7), preset)
    assert not same(batches(folder, composed_with("nearest"), seed=7), preset)
    images, labels = a[0]
    assert images.shape == (6, 3, 176, 176) and labels.shape == (6, 3)  # soft labels, 3 classes
    assert torch.allclose(labels.sum(1), torch.ones(6))
    evaluation = T.Compose([T.Resize(232), T.CenterCrop(224), T.ToDtype(torch.float32, True),
                            T.Normalize(MEAN, STD)])
    assert same(batches(folder, evaluation), batches(folder, "resnet50", train=False))


# ---- Each op family's parameters reach C++ ---------------------------------------------------

def test_geometry_and_flips(folder):
    plain = base(folder, T.ToTensor())
    images = plain[0]
    assert images.shape == (12, 3, 64, 64) and 0 <= images.min() and images.max() <= 1
    assert torch.equal(base(folder, T.RandomHorizontalFlip(p=1.0), T.ToTensor())[0],
                       images.flip(-1))
    assert torch.equal(base(folder, T.RandomVerticalFlip(1.0), T.ToTensor())[0], images.flip(-2))
    assert torch.equal(base(folder, T.RandomHorizontalFlip(p=0.0), T.ToTensor())[0], images)
    # Sizes: RandomResizedCrop's (h, w), Resize then CenterCrop, RandomCrop with pad_if_needed.
    assert batches(folder, T.Compose([T.RandomResizedCrop([96, 96], scale=(0.5, 0.5)),
                                      T.ToTensor()]))[0][0].shape == (6, 3, 96, 96)
    assert batches(folder, T.Compose([T.Resize(80), T.CenterCrop(48), T.ToTensor()]))[0][0] \
        .shape == (6, 3, 48, 48)
    padded = batches(folder, T.Compose([T.RandomCrop(600, pad_if_needed=True, fill=255),
                                        T.ToTensor()]), batch_size=12)[0][0]
    # Every image is narrower and lower than 600: at least (600 - 470) rows are the fill.
    assert padded.shape == (12, 3, 600, 600)
    assert ((padded == 1.0).sum((1, 2, 3)) >= 3 * 130 * 600).all()


def test_float_conversion_and_normalize(folder):
    unit = base(folder, T.ToTensor())[0]
    raw = base(folder, T.ToDtype(torch.float32))[0]  # no scale: the uint8 values as floats
    assert torch.equal(raw, (unit * 255).round())
    normed = base(folder, T.ToDtype(torch.float32, scale=True), T.Normalize([0.5] * 3, [0.25] * 3))[0]
    assert torch.allclose(normed, (unit - 0.5) / 0.25, atol=1e-6)
    gray = base(folder, T.Grayscale(num_output_channels=3), T.ToTensor())[0]
    assert torch.equal(gray[:, 0], gray[:, 1]) and torch.equal(gray[:, 1], gray[:, 2])
    assert not torch.equal(gray, unit)


def test_random_erasing_erases(folder):
    erased = base(folder, T.ToTensor(), T.RandomErasing(p=1.0, scale=(0.25, 0.25),
                                                         ratio=(1.0, 1.0), value=7.0))[0]
    # A 32 x 32 box (a quarter of 64 x 64, square) of 7.0 in each of the 3 channels of every image.
    assert ((erased == 7.0).sum((1, 2, 3)) == 3 * 32 * 32).all()
    none = base(folder, T.ToTensor(), T.RandomErasing(p=0.0, value=7.0))[0]
    assert (none == 7.0).sum() == 0


def test_colour_and_blur(folder):
    unit = base(folder, T.ToTensor())[0]
    # (0.5, 1.5) is brightness 0.5's range: accepted; the adjustment changes the images.
    bright = base(folder, T.ColorJitter(brightness=(0.5, 1.5)), T.ToTensor())
    assert same([bright], [base(folder, T.ColorJitter(brightness=0.5), T.ToTensor())])
    assert not torch.equal(bright[0], unit)
    blurred = base(folder, T.GaussianBlur(5, sigma=3.0), T.ToTensor())[0]
    # A blur smooths: neighbouring pixels differ less than in the original.
    assert blurred.diff(dim=-1).abs().mean() < 0.7 * unit.diff(dim=-1).abs().mean()


@pytest.mark.parametrize("op", [
    T.TrivialAugmentWide(num_magnitude_bins=8), T.RandAugment(num_ops=3, magnitude=5),
    T.AutoAugment(), T.AugMix(severity=2, mixture_width=2), T.RandomRotation(30, fill=[0, 0, 255]),
    T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5),
    T.RandomPerspective(0.6, p=1.0)])
def test_policies_and_warps(folder, op):
    unit = base(folder, T.ToTensor())[0]
    inline = base(folder, op, T.ToTensor())
    assert inline[0].shape == unit.shape and not torch.equal(inline[0], unit)
    assert same([inline], [base(folder, op, T.ToTensor(), num_workers=2)])  # per-sample streams


def test_rotation_parameters_reach_cpp(folder):
    unit = base(folder, T.ToTensor())[0]
    assert torch.equal(base(folder, T.RandomRotation((0, 0)), T.ToTensor())[0], unit)
    quarter = base(folder, T.RandomRotation((90, 90)), T.ToTensor())[0]
    # A square turned by exactly 90 degrees counter-clockwise, nearest: torch.rot90's pixels.
    assert (quarter == unit.rot90(1, (-2, -1))).float().mean() > 0.99
    assert torch.equal(base(folder, T.RandomPerspective(p=0.0), T.ToTensor())[0], unit)


def test_batch_ops_soft_labels(folder):
    plain = T.Compose([T.CenterCrop(64), T.ToTensor()])
    unmixed = batches(folder, plain, batch_size=12)[0][0]
    for op in (T.MixUp(alpha=0.5), T.CutMix(alpha=1.0, num_classes=7),
               T.RandomChoice([T.MixUp(), T.CutMix()], p=[0.3, 0.7])):
        images, labels = batches(folder, T.Compose([plain, op]), batch_size=12)[0]
        classes = 7 if isinstance(op, T.CutMix) else 3
        assert labels.shape == (12, classes) and labels.dtype == torch.float32
        assert torch.allclose(labels.sum(1), torch.ones(12))
        # Mixed with the batch rolled by one: rows between two classes share their weight.
        assert (labels.max(1).values < 1.0).any() and not torch.equal(images, unmixed)


# ---- The shard pipeline takes the same recipes ------------------------------------------------

def test_shard_image_folder(folder, tmp_path):
    ds = coload.vision.ImageFolder(folder)
    shards = tmp_path / "shards"
    shards.mkdir()
    with tarfile.open(shards / "shard-000.tar", "w") as tar:  # ImageFolder's order, as a tar
        for i, (path, label) in enumerate(ds.samples):
            for ext, payload in (("jpg", open(path, "rb").read()), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    (shards / "classes.txt").write_text("".join(c + "\n" for c in ds.classes))

    def shard_batches(recipe, train=True, **kwargs):
        sd = coload.shards.ShardImageFolder(shards, recipe=recipe, train=train)
        assert len(sd) == 12 and sd.num_classes == 3
        return list(coload.DataLoader(sd, batch_size=6, seed=5, **kwargs))

    assert same(shard_batches("classic", train=False), batches(folder, "classic", train=False))
    # A composed recipe, its MixUp/CutMix's class count from classes.txt: the same batches as
    # the folder's (each sample's stream and each batch's are functions of the seed and index).
    mixed = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor(),
                       T.RandomChoice([T.MixUp(alpha=0.4), T.CutMix()])])
    expected = batches(folder, mixed)
    assert expected[0][1].shape == (6, 3)
    assert same(shard_batches(mixed), expected)
    assert same(shard_batches(mixed, num_workers=2), expected)
    # classes.txt is found beside one shard, a file:// URL (percent-encoded) and a brace
    # pattern too; none there is 0 classes.
    spaced = tmp_path / "my shards"
    shards.rename(spaced)
    for where in (spaced / "shard-000.tar", spaced.as_uri(), str(spaced / "shard-{000..000}.tar")):
        assert coload.shards.ShardImageFolder(where).num_classes == 3, where
    (spaced / "classes.txt").unlink()
    assert coload.shards.ShardImageFolder(spaced.as_uri()).num_classes == 0


# ---- Python callables as user ops ------------------------------------------------------------

def fill_drawn(image, generator):
    # The value comes from the op's own generator: a function of (seed, epoch, index).
    image.fill_(int(torch.randint(0, 256, (1,), generator=generator)))


def test_custom_ops(folder):
    unit = base(folder, T.ToTensor())[0]
    white = base(folder, T.Custom(lambda image, g: torch.full_like(image, 255)), T.ToTensor())[0]
    assert torch.equal(white, torch.ones_like(unit))
    plus = base(folder, T.ToTensor(), T.Custom(lambda image, g: image.add_(1)))[0]
    assert torch.equal(plus, unit + 1)

    drawn = T.Compose([T.CenterCrop(32), T.Custom(fill_drawn), T.ToDtype(torch.float32)])
    inline = batches(folder, drawn, batch_size=4)
    threads = batches(folder, drawn, batch_size=4, num_workers=2)
    processes = batches(folder, drawn, batch_size=4, num_workers=2, executor="processes")
    assert same(inline, threads) and same(inline, processes)
    values = torch.cat([b[0] for b in inline]).amax((1, 2, 3))
    assert len(set(values.tolist())) > 6  # each sample drew its own value
    assert torch.equal(torch.cat([b[0] for b in inline]).amin((1, 2, 3)), values)

    def zero_batch(images, labels, generator):
        return images * 0, labels + 10

    images, labels = batches(folder, T.Compose([T.CenterCrop(32), T.ToTensor(),
                                                T.CustomBatch(zero_batch)]), batch_size=12)[0]
    assert images.abs().sum() == 0 and labels.min() >= 10


def test_custom_op_errors(folder):
    def broken(image, generator):
        raise KeyError("no such thing")

    # The recipe wraps a user op's error in its own, naming the op: the Python exception's
    # type and message travel in the text.
    with pytest.raises(coload.SampleError,
                       match=r"op 1 \(Custom 'broken'\) failed: KeyError: 'no such thing'"):
        base(folder, T.Custom(broken), T.ToTensor())
    with pytest.raises(coload.SampleError, match="must keep the image's"):
        base(folder, T.Custom(lambda image, g: image[:1]), T.ToTensor())
    with pytest.raises(coload.SampleError, match="returns None"):
        base(folder, T.ToTensor(), T.CustomBatch(lambda i, l, g: 3, name="three"))
    with pytest.raises(TypeError, match="callable"):
        T.Custom(42)


# ---- Errors: the builder's wording, the op's place in the list -------------------------------

@pytest.mark.parametrize("ops, error, message", [
    ([T.RandomResizedCrop(224), T.RandomHorizontalFlip(p=1.5), T.ToTensor()], ValueError,
     r"^Recipe: op 1 \(RandomHorizontalFlip\): `p` should be a floating point value in the "
     r"interval \[0.0, 1.0\].$"),
    ([T.RandomResizedCrop(224), T.ToImage(), T.RandomVerticalFlip(-1), T.ToTensor()], ValueError,
     r"^Recipe: op 2 \(RandomVerticalFlip\)"),  # counted in the list as given
    ([T.RandomResizedCrop(224), T.Normalize(MEAN, STD)], ValueError,
     r"Input tensor should be a float tensor. Got torch.uint8."),
    ([T.RandomResizedCrop(224), T.RandomHorizontalFlip()], ValueError,
     r"the fused pipeline writes float32 batches"),
    ([T.CenterCrop(64), T.GaussianBlur(4), T.ToTensor()], ValueError,
     r"Kernel size value should be an odd and positive number."),
    ([T.CenterCrop(64), T.ToTensor(), T.RandomErasing(p=2)], ValueError,
     r"Random erasing probability should be between 0 and 1"),
    ([T.CenterCrop(64), T.AugMix(severity=11), T.ToTensor()], ValueError,
     r"The severity must be between \[1, 10\]. Got 11 instead."),
    ([T.CenterCrop(64), T.ColorJitter(brightness=-1), T.ToTensor()], ValueError,
     r"If brightness is a single number, it must be non negative."),
    ([T.CenterCrop(64), T.ColorJitter(contrast=(0.2, 0.9)), T.ToTensor()], ValueError,
     r"not supported in a recipe yet"),
    ([T.CenterCrop(64), T.RandomPerspective(1.5), T.ToTensor()], ValueError,
     r"Argument distortion_scale value should be between 0 and 1"),
    ([T.CenterCrop(64), T.RandomAffine(0, shear=[1, 2, 3]), T.ToTensor()], ValueError,
     r"shear should be a sequence of length 2 or 4."),
    ([T.CenterCrop(64), T.ToTensor(), T.MixUp(alpha=0), T.Normalize(MEAN, STD)], ValueError,
     r"only batch ops may follow it \(op 3 is Normalize\)"),
    ([T.CenterCrop(64), T.ToTensor(), T.RandomChoice([T.MixUp()], p=[1, 2])], ValueError,
     r"Length of p doesn't match the number of transforms: 2 != 1"),
    ([T.CenterCrop(64), T.ToDtype(torch.float64), T.ToTensor()], ValueError,
     r"ToDtype to Double is not supported"),
    ([T.RandomResizedCrop(224, interpolation="nearest"), T.ToTensor()], ValueError,
     r"interpolation 'nearest' is not supported in a recipe yet"),
    ([T.RandomResizedCrop("big"), T.ToTensor()], TypeError, r"Size should be int or sequence"),
    ([T.CenterCrop(64), T.ToTensor(), T.RandomErasing(value="random")], ValueError,
     r"value='random' \(random values\) is not supported"),
    ([T.CenterCrop(64), T.ToTensor(), T.RandomChoice([T.ToTensor()])], TypeError,
     r"chooses among MixUp and CutMix"),
    ([T.CenterCrop(64), lambda x: x, T.ToTensor()], TypeError,
     r"is not an op of coload.vision.transforms"),
])
def test_errors(ops, error, message):
    with pytest.raises(error, match=message):
        T.Compose(ops)


def test_usage_errors(folder):
    with pytest.raises(ValueError, match=r"writes square images .* 64x32"):
        coload.vision.ImageFolder(folder, recipe=T.Compose([T.CenterCrop((64, 32)), T.ToTensor()]))
    with pytest.raises(TypeError, match="recipe should be a preset's name or a coload.vision.Recipe"):
        coload.vision.ImageFolder(folder, recipe=42)
    with pytest.raises(TypeError, match="run by coload's fused pipeline"):
        T.RandomHorizontalFlip()(torch.zeros(3, 8, 8))
    with pytest.raises(TypeError, match="a list of ops"):
        T.Compose(T.ToTensor())
    recipe = T.Compose([T.RandomResizedCrop((96, 96)), T.ToTensor()], dct_scaling=False)
    assert recipe.output_size == (96, 96) and "RandomResizedCrop(size=(96, 96)" in repr(recipe)
