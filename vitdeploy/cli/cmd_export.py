"""`vitdeploy export`."""

from __future__ import annotations

import click

from ..spec import parse_resolution
from .common import command, parse_model_args, split_csv


@command("export")
@click.argument("source", required=False, default="builtin:digits")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Bundle folder to write (replaced atomically).")
@click.option("--checkpoint", type=click.Path(dir_okay=False), help="Weights for timm sources instead of the published ones: .safetensors, or .pt/.pth loaded with weights_only=True.")
@click.option("--random-init", is_flag=True,
              help="Random weights (seeded) instead of the published ones, for timing and graph work: every command then says the weights are random.")
@click.option("--num-classes", type=click.IntRange(min=1), help="Classifier width for timm sources (inferred from the checkpoint's head if omitted).")
@click.option("--model-arg", "model_args", multiple=True, metavar="KEY=VALUE",
              help="timm.create_model argument of the fine-tuned architecture, e.g. class_token=false, global_pool=avg (repeatable).")
@click.option("--labels", "labels_file", type=click.Path(dir_okay=False), help="labels.txt, one label per line in index order (overrides the source's labels).")
@click.option("--resolution", help="Static export at N or HxW: the position table is re-interpolated offline.")
@click.option("--dynamic-resolution", is_flag=True, help="Symbolic H/W; the position table is interpolated inside the graph.")
@click.option("--resize", is_flag=True, help="Resize inside the graph from any input size to the model resolution (bilinear, no antialias).")
@click.option("--variable-size", is_flag=True, help="Two inputs: images padded top-left into --canvas, and valid_hw [B, 2]; each image gets its own position grid and padded patches are masked.")
@click.option("--canvas", help="With --variable-size: the largest size served, N or HxW (whole patches).")
@click.option("--variable-policy", type=click.Choice(["fit-within", "shrink-within", "none"]), default="fit-within", show_default=True,
              help="With --variable-size: how the runtime fits an image into the canvas (recorded in the manifest).")
@click.option("--channel-order", type=click.Choice(["rgb", "bgr"]), default="rgb", show_default=True, help="Channel order of the uint8 input (bgr for OpenCV pipelines).")
@click.option("--input", "input_format", type=click.Choice(["uint8-nhwc", "float-nchw"]), default="uint8-nhwc", show_default=True, help="float-nchw: the caller preprocesses.")
@click.option("--pos-interp", type=click.Choice(["bicubic", "bilinear"]), default="bicubic", show_default=True, help="Position-table interpolation method.")
@click.option("--align-corners/--no-align-corners", default=False, show_default=True, help="Corner convention of the position-table interpolation.")
@click.option("--antialias/--no-antialias", default=False, show_default=True, help="Antialias when shrinking the table (TensorRT's parser does not implement it).")
@click.option("--precision", default="fp32", show_default=True, help="Graphs to write: fp32, or fp32,fp16 (fp16 also writes model.fp16.onnx).")
@click.option("--keep-fp32", default="", help="More kept in fp32 in the fp16 graph, comma-separated: op types, modules (blocks.3), roles or MODULE/ROLE cells.")
@click.option("--fp16-data", default=None,
              help="With --precision fp32,fp16: range images for the fp16 range pass (nodes overflowing fp16 on them stay fp32); "
                   "labelled ones also gate accuracy (default: the digits splits for the digits model, else seeded noise).")
@click.option("--no-simplify", is_flag=True, help="Keep the exporter's graph (otherwise onnxslim's graph is kept when it passes the verification against PyTorch; with --no-check, when ORT outputs stay bit-identical).")
@click.option("--no-check", is_flag=True, help="Skip the ONNX Runtime vs PyTorch parity check.")
@click.option("--check-images", type=click.IntRange(min=1), default=64, show_default=True, help="Seeded images per size for the parity check.")
@click.option("--outputs", "outputs", metavar="LIST",
              help="Graph outputs, any of logits,probs,embedding,patch_grid (default: logits,probs; embedding,patch_grid for a model without a head). "
                   "embedding [B,d] is the pooled pre-head feature, patch_grid [B,d,G_h,G_w] the final patch tokens in row-major grid order.")
@click.option("--normalize-embedding", is_flag=True, help="L2-normalise the embedding output inside the graph (for cosine retrieval).")
@click.option("--external-data-threshold", "external_data", metavar="SIZE",
              help="Write a graph whose weights exceed SIZE (e.g. 512MiB, 1GiB; 0: always) with its weights in <graph>.onnx.data "
                   "beside it; recorded, so the bundle's later passes (fp16, int8, CPU and TensorRT 8.x graphs) follow it. "
                   "Default: $VITDEPLOY_EXTERNAL_DATA_THRESHOLD, else 1GiB (graphs near protobuf's 2 GiB limit always).")
@click.option("--merge-tokens", "merge_tokens", metavar="R|R1,R2,...",
              help="Token merging (ToMe, Bolya et al. 2023): merge R patch tokens in every block after attention, or one R per "
                   "block; static shapes, verified against the merged PyTorch model (docs/TOKEN_MERGING.md).")
def command(source, out_dir, checkpoint, random_init, num_classes, model_args, labels_file, resolution, dynamic_resolution, resize,
            variable_size, canvas, variable_policy, channel_order,
            input_format, pos_interp, align_corners, antialias, precision, keep_fp32, fp16_data, no_simplify, no_check, check_images,
            outputs, normalize_embedding, external_data, merge_tokens):
    """Export SOURCE to a bundle: ONNX that takes raw uint8 images, with preprocessing, labels and spec bound in.

    SOURCE is builtin:digits (default); timm:<name>[.<tag>][@<revision>] or timm:hf-hub:<org>/<name>
    (timm's published weights, through the Hugging Face hub or its cache); hf:<org>/<name>[@<revision>]
    (a transformers ViT, DeiT, BEiT or DINOv2 with its image processor) or hf:<directory saved with
    save_pretrained>; or ref:<checkpoint.safetensors> (a vitdeploy reference ViT with its .json beside it).
    Weights that cannot be had (not cached with HF_HUB_OFFLINE=1, no network, gated without HF_TOKEN,
    unknown tag) are refused in one line; random weights only with --random-init.

    \b
    Example:
      vitdeploy export -o digits-bundle
      vitdeploy export timm:deit_tiny_patch16_224.fb_in1k -o deit-tiny
      HF_HUB_OFFLINE=1 vitdeploy export hf:google/vit-base-patch16-224 -o vitb   # from the cache only
      vitdeploy export timm:vit_small_patch16_224 --checkpoint ft.safetensors -o vits --resolution 384
      vitdeploy export hf:./my-vit -o myvit --dynamic-resolution --channel-order bgr
      vitdeploy export timm:eva02_small_patch14_336.mim_in22k_ft_in1k -o eva02 --dynamic-resolution
      vitdeploy export timm:vit_small_patch16_224 --random-init -o vits-var --variable-size --canvas 384x384
      vitdeploy export -o digits-feat --outputs logits,probs,embedding,patch_grid --normalize-embedding
      vitdeploy export hf:facebook/dinov2-small -o dinov2 --dynamic-resolution   # no head: embedding,patch_grid
      vitdeploy export timm:vit_huge_patch14_224 -o vith --external-data-threshold 0   # model.onnx + model.onnx.data
      vitdeploy export timm:vit_base_patch16_224 -o vitb-tome --merge-tokens 8   # 197 -> 101 tokens
    """
    from vitdeploy.exporters import ExportOptions, export
    from vitdeploy.onnx_io import parse_size
    from vitdeploy.posembed import PosEmbedInterpolation

    precisions = tuple(split_csv(precision)) or ("fp32",)
    if "fp16" in precisions and "fp32" not in precisions:
        precisions = ("fp32",) + precisions  # fp16 is derived from the verified fp32 graph
    options = ExportOptions(
        checkpoint=checkpoint,
        random_init=random_init,
        num_classes=num_classes,
        model_kwargs=parse_model_args(model_args),
        labels_file=labels_file,
        resolution=parse_resolution(resolution) if resolution else None,
        dynamic_resolution=dynamic_resolution,
        resize=resize,
        variable_size=variable_size,
        canvas=parse_resolution(canvas) if canvas else None,
        variable_policy=variable_policy,
        channel_order=channel_order,
        input_format=input_format,
        interpolation=PosEmbedInterpolation(pos_interp, align_corners, antialias),
        precisions=precisions,
        keep_fp32=tuple(split_csv(keep_fp32)),
        fp16_data=fp16_data,
        simplify=not no_simplify,
        check=not no_check,
        check_images=check_images,
        outputs=outputs,
        normalize_embedding=normalize_embedding,
        external_data_threshold=parse_size(external_data) if external_data is not None else None,
        merge_tokens=merge_tokens,
    )
    bundle = export(source, out_dir, options)  # progress lines: the exporter's loggers (vitdeploy -v/-q)
    click.echo(f"bundle written: {bundle.root} ({', '.join(bundle.precisions())})")
