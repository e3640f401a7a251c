"""PyTorch definitions of the kiln model zoo (see zoo/README.md).

Each model is a small but faithful copy of a well-known architecture: widths and depths are
cut down so that the exported ONNX file stays well under 2 MB, the op patterns are kept as
the original implementations (torchvision, BERT, GPT-2, timm's ViT) produce them.
Weights are random; `randomize_()` makes every parameter and buffer non-trivial (no
all-ones/zeros BatchNorm or LayerNorm, no zero biases, non-trivial BN running statistics)
so that passes like Conv+BN folding are really exercised.
"""

import math
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf
from torchvision.models.squeezenet import Fire


# --------------------------------------------------------------------------------------
# Non-trivial random parameters
# --------------------------------------------------------------------------------------


@torch.no_grad()
def randomize_(model: nn.Module, seed: int, fan_in_gain: float = 1.0,
               calibrate: Optional[Callable[[torch.Generator], torch.Tensor]] = None) -> nn.Module:
    """Gives every parameter and buffer a non-trivial, signal-preserving value, deterministically.

    - Conv/ConvTranspose/Linear/Conv1D weights: N(0, (fan_in_gain / sqrt(fan_in))^2), so that
      the output still depends on the input after many layers (default inits, e.g. torchvision's
      Linear std 0.01, make random CNNs output little more than their last bias).
    - Biases U(-0.1, 0.1); LayerNorm/BatchNorm gamma U(0.6, 1.4), beta N(0, 0.1);
      embeddings N(0, 0.5^2).
    - BatchNorm running statistics: if `calibrate` is given (returns a random input batch), they
      are measured by running the model in train mode over a few such batches (as after
      training: non-zero means, non-unit variances, consistent with the activations), then
      perturbed a little; otherwise they are drawn at random.
    """
    g = torch.Generator().manual_seed(seed)

    def uniform(t, lo, hi):
        t.copy_(torch.rand(t.shape, generator=g) * (hi - lo) + lo)

    def normal(t, std):
        t.copy_(torch.randn(t.shape, generator=g) * std)

    bns = [m for m in model.modules() if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d))]
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
        elif isinstance(m, nn.ConvTranspose2d):  # weight [in, out/groups, kh, kw]
            fan_in = m.weight.shape[0] // m.groups * m.weight[0, 0].numel()
        elif isinstance(m, Conv1D):  # weight [in, out]
            fan_in = m.weight.shape[0]
        else:
            fan_in = None
        if fan_in is not None:
            normal(m.weight, fan_in_gain / math.sqrt(fan_in))
            if m.bias is not None:
                uniform(m.bias, -0.1, 0.1)
        if isinstance(m, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)):
            uniform(m.weight, 0.6, 1.4)
            normal(m.bias, 0.1)
        elif isinstance(m, nn.Embedding):
            normal(m.weight, 0.5)
    if bns and calibrate is not None:
        training, momenta = model.training, [m.momentum for m in bns]
        for m in bns:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batches
        model.train()
        for _ in range(4):
            model(calibrate(g))
        model.train(training)
        for m, momentum in zip(bns, momenta):
            m.momentum = momentum
            m.running_mean.add_(torch.randn(m.running_mean.shape, generator=g) * 0.05)
            m.running_var.mul_(torch.rand(m.running_var.shape, generator=g) * 0.2 + 0.9)
    else:
        for m in bns:
            normal(m.running_mean, 0.2)
            uniform(m.running_var, 0.4, 1.6)
    return model


# --------------------------------------------------------------------------------------
# CNNs
# --------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """torchvision ResNet BasicBlock (conv-bn-relu-conv-bn + identity/downsample, relu)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetTiny(nn.Module):
    """ResNet-18 layout (7x7/2 stem, 3x3/2 maxpool, 4 stages) with widths 16-128, 1 block/stage."""

    def __init__(self, widths=(16, 32, 64, 128), blocks=(1, 1, 1, 1), num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            stage = []
            for j in range(n):
                stage.append(BasicBlock(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def mobilenetv3_tiny():
    """torchvision MobileNetV3-Small, width multiplier 0.5, 10 classes."""
    setting, last_channel = _mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.5)
    return MobileNetV3(setting, last_channel, num_classes=10)


def efficientnet_tiny():
    """torchvision EfficientNet-B0 layout, width 0.25, depth 0.34 (10 MBConv blocks), 10 classes."""
    setting, last_channel = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.34)
    return EfficientNet(setting, dropout=0.2, stochastic_depth_prob=0.2, num_classes=10,
                        last_channel=last_channel)


class SqueezeNetTiny(nn.Module):
    """torchvision SqueezeNet 1.1 layout (torchvision Fire modules) at half width, 10 classes."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, kernel_size=3, stride=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(32, 8, 32, 32),
            Fire(64, 8, 32, 32),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(64, 16, 64, 64),
            Fire(128, 16, 64, 64),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(128, 24, 96, 96),
            Fire(192, 32, 128, 128),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(p=0.5),
            nn.Conv2d(256, num_classes, kernel_size=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d((1, 1)),
        )

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


def conv_bn_relu(cin, cout):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


class UNetTiny(nn.Module):
    """U-Net, 3 down / 3 up stages. Decoder upsampling: ConvTranspose2d (stage 1),
    nn.Upsample bilinear align_corners=False (stage 2), nn.Upsample nearest (stage 3);
    each followed by a skip concat and a double conv-bn-relu."""

    def __init__(self, cin=3, classes=2, w=8):
        super().__init__()
        self.enc1 = conv_bn_relu(cin, w)
        self.enc2 = conv_bn_relu(w, 2 * w)
        self.enc3 = conv_bn_relu(2 * w, 4 * w)
        self.bottleneck = conv_bn_relu(4 * w, 8 * w)
        self.pool = nn.MaxPool2d(2)
        self.up3 = nn.ConvTranspose2d(8 * w, 4 * w, 2, stride=2)
        self.dec3 = conv_bn_relu(8 * w, 4 * w)
        self.up2 = nn.Sequential(
            nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
            nn.Conv2d(4 * w, 2 * w, 1),
        )
        self.dec2 = conv_bn_relu(4 * w, 2 * w)
        self.up1 = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(2 * w, w, 1))
        self.dec1 = conv_bn_relu(2 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        e3 = self.enc3(self.pool(e2))
        b = self.bottleneck(self.pool(e3))
        d3 = self.dec3(torch.cat([self.up3(b), e3], dim=1))
        d2 = self.dec2(torch.cat([self.up2(d3), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def resnet50():
    """torchvision resnet50, random weights (large model, not committed)."""
    return torchvision.models.resnet50(weights=None)


# --------------------------------------------------------------------------------------
# Transformers
# --------------------------------------------------------------------------------------


class ViTAttention(nn.Module):
    """timm ViT attention: one qkv Linear, reshape/permute, softmax(q k^T * scale) v, proj."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(x)


class ViTBlock(nn.Module):
    def __init__(self, dim, heads, mlp_ratio=4):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ViTAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * mlp_ratio), nn.GELU(),
                                 nn.Linear(dim * mlp_ratio, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViTTiny(nn.Module):
    """ViT: conv patch embedding, cls token concat, learned position embedding add,
    pre-norm blocks (LayerNorm, MHA, GELU MLP), final LayerNorm, head on the cls token."""

    def __init__(self, img=32, patch=8, dim=64, depth=2, heads=4, num_classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        n = (img // patch) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.5)
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # [B, N, C]
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


class BertSelfAttention(nn.Module):
    """HF BertSelfAttention: separate q/k/v Linear, transpose_for_scores via view(size()[:-1]+
    (heads, head_dim)), scores / sqrt(d) + additive mask, softmax, context."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def split(self, x):
        x = x.view(x.size()[:-1] + (self.heads, self.head_dim))
        return x.permute(0, 2, 1, 3)

    def forward(self, h, additive_mask):
        q, k, v = self.split(self.query(h)), self.split(self.key(h)), self.split(self.value(h))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores + additive_mask
        probs = F.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.size()[:-2] + (self.heads * self.head_dim,))


class BertLayer(nn.Module):
    """Post-norm BERT layer: attention -> dense -> add & LayerNorm -> GELU(erf) FFN -> add & LN."""

    def __init__(self, hidden, heads, inter, eps=1e-12):
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, inter)
        self.act = nn.GELU()  # exact erf form
        self.output = nn.Linear(inter, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(0.1)

    def forward(self, h, additive_mask):
        a = self.attn_norm(self.dropout(self.attn_out(self.attention(h, additive_mask))) + h)
        f = self.output(self.act(self.intermediate(a)))
        return self.out_norm(self.dropout(f) + a)


class BertEncoder(nn.Module):
    """BERT: word + position + token-type embeddings, LayerNorm, N post-norm layers, pooler.

    Inputs: input_ids, attention_mask, token_type_ids (all int64 [batch, seq]).
    The padding mask becomes (1 - mask) * -10000 added to the attention scores (the classic
    BERT formulation). Outputs: last_hidden_state [batch, seq, hidden], pooler_output
    [batch, hidden] (tanh(Linear(h[:, 0])))."""

    def __init__(self, vocab=1000, hidden=64, layers=2, heads=4, inter=256, max_pos=128,
                 type_vocab=2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=0)
        self.position_embeddings = nn.Embedding(max_pos, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)))
        self.layers = nn.ModuleList([BertLayer(hidden, heads, inter) for _ in range(layers)])
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids, attention_mask, token_type_ids):
        seq = input_ids.size(1)
        pos = self.position_ids[:, :seq]
        h = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(pos))
        h = self.emb_norm(h)
        ext = attention_mask[:, None, None, :].to(h.dtype)
        ext = (1.0 - ext) * -10000.0
        for layer in self.layers:
            h = layer(h, ext)
        pooled = torch.tanh(self.pooler(h[:, 0]))
        return h, pooled


class Conv1D(nn.Module):
    """GPT-2 Conv1D: y = x @ W + b with W [in, out], computed as addmm on a 2-D view."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


def gelu_new(x):
    """GPT-2 "gelu_new": the tanh approximation, written out."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    """HF GPT2Attention: c_attn Conv1D -> split q,k,v -> scores / sqrt(d) -> causal mask from a
    lower-triangular buffer via torch.where with the dtype minimum -> softmax -> c_proj."""

    def __init__(self, hidden, heads, max_pos):
        super().__init__()
        self.heads, self.head_dim, self.hidden = heads, hidden // heads, hidden
        self.register_buffer(
            "bias", torch.tril(torch.ones((max_pos, max_pos), dtype=torch.bool)).view(1, 1, max_pos, max_pos))
        self.c_attn = Conv1D(3 * hidden, hidden)
        self.c_proj = Conv1D(hidden, hidden)

    def split_heads(self, x):
        x = x.view(x.size()[:-1] + (self.heads, self.head_dim))
        return x.permute(0, 2, 1, 3)

    def forward(self, h):
        q, k, v = self.c_attn(h).split(self.hidden, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full(
            [], v.size(-1) ** 0.5, dtype=q.dtype, device=q.device)
        ql, kl = q.size(-2), k.size(-2)
        causal = self.bias[:, :, kl - ql:kl, :kl]
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(causal, w, mask_value)
        w = F.softmax(w, dim=-1)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        a = a.view(a.size()[:-2] + (self.hidden,))
        return self.c_proj(a)


class GPT2Block(nn.Module):
    def __init__(self, hidden, heads, max_pos, eps=1e-5):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.attn = GPT2Attention(hidden, heads, max_pos)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.c_fc = Conv1D(4 * hidden, hidden)
        self.c_proj = Conv1D(hidden, 4 * hidden)

    def forward(self, h):
        h = h + self.attn(self.ln_1(h))
        return h + self.c_proj(gelu_new(self.c_fc(self.ln_2(h))))


class GPT2Tiny(nn.Module):
    """GPT-2 LM: wte + wpe (position ids from arange), pre-norm blocks, ln_f, and an lm head
    that reuses wte.weight (tied). Input: input_ids int64 [batch, seq]; output logits."""

    def __init__(self, vocab=1000, hidden=64, layers=2, heads=4, max_pos=128):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_pos, hidden)
        self.h = nn.ModuleList([GPT2Block(hidden, heads, max_pos) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, input_ids):
        seq = input_ids.size(-1)
        pos = torch.arange(0, seq, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        h = self.wte(input_ids) + self.wpe(pos)
        for block in self.h:
            h = block(h)
        h = self.ln_f(h)
        return torch.matmul(h, self.wte.weight.t())  # tied lm head
